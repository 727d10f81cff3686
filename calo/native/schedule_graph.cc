// calo.schedule_graph's extract_graph in C++, for many PrimFuncs in one call.
//
// A search scores hundreds of candidates a generation; walking each one's TIR from Python costs
// a fraction of a millisecond in attribute reads through the FFI. This walk reads the same
// fields through tvm-ffi's reflection table (each field's getter looked up once by name), so it
// builds against the headers of the installed tvm-ffi wheel alone, and it follows the Python
// walker statement for statement: same nodes, edges, order and float32 values
// (tests/test_native.py compares the two on real candidates). The Python walker is the
// specification; a change to one is a change to both.
//
// extract_graphs(programs, feature_names, cores, vector_bytes, with_device, threads) walks each
// program (a PrimFunc, or the "main" function of an IRModule or of a MeasureCandidate's
// scheduled module) and returns
// [x float32 [N, F], src int64 [E], dst int64 [E], edge_type int64 [E], nodes int64 [G],
// edges int64 [G]] as byte strings: every graph's rows and edges concatenated, node ids local
// to their graph.

#include <tvm/ffi/tvm_ffi.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

namespace {

namespace ffi = tvm::ffi;
using ffi::Any;
using ffi::Array;
using ffi::Object;
using ffi::ObjectRef;

// ---- reflection ------------------------------------------------------------------------------

int32_t TypeIndexOf(const char* key) {
  int32_t index;
  TVMFFIByteArray name{key, std::strlen(key)};
  TVM_FFI_CHECK_SAFE_CALL(TVMFFITypeKeyToIndex(&name, &index));
  return index;
}

// The type itself, then its ancestors from the nearest: fields are declared where they belong.
template <typename Fn>
void ForEachType(int32_t type_index, Fn fn) {
  const TVMFFITypeInfo* info = TVMFFIGetTypeInfo(type_index);
  fn(info);
  for (int32_t depth = info->type_depth - 1; depth >= 0; --depth) fn(info->type_ancestors[depth]);
}

const TVMFFIFieldInfo* FindField(int32_t type_index, const char* name) {
  const TVMFFIFieldInfo* found = nullptr;
  ForEachType(type_index, [&](const TVMFFITypeInfo* t) {
    for (int32_t i = 0; i < t->num_fields && found == nullptr; ++i) {
      if (t->fields[i].name.size == std::strlen(name) &&
          std::memcmp(t->fields[i].name.data, name, t->fields[i].name.size) == 0) {
        found = &t->fields[i];
      }
    }
  });
  return found;
}

Any Read(const Object* obj, const TVMFFIFieldInfo* field) {
  Any out;
  void* addr = const_cast<char*>(reinterpret_cast<const char*>(obj) + field->offset);
  TVM_FFI_CHECK_SAFE_CALL(field->getter(addr, reinterpret_cast<TVMFFIAny*>(&out)));
  return out;
}

// A view of the type table's own key: comparing it allocates nothing.
std::string_view TypeKey(const Object* obj) {
  const TVMFFIByteArray& key = TVMFFIGetTypeInfo(obj->type_index())->type_key;
  return std::string_view(key.data, key.size);
}

bool IsA(const Object* obj, int32_t base) {
  if (obj->type_index() == base) return true;
  const TVMFFITypeInfo* info = TVMFFIGetTypeInfo(obj->type_index());
  for (int32_t i = 0; i < info->type_depth; ++i) {
    if (info->type_ancestors[i]->type_index == base) return true;
  }
  return false;
}

const Object* ObjectOf(const Any& value) {
  return value.type_index() >= ffi::TypeIndex::kTVMFFIStaticObjectBegin
             ? static_cast<const Object*>(value.as<Object>())
             : nullptr;
}

ObjectRef RefOf(const Object* obj) {
  using ffi::details::ObjectUnsafe;
  return ObjectUnsafe::ObjectRefFromObjectPtr<ObjectRef>(
      ObjectUnsafe::ObjectPtrFromUnowned<Object>(const_cast<Object*>(obj)));
}

// An object field is read in place when reflection says it is one pointer to an object (an
// ObjectRef, Array or Optional of one): no getter call, no reference count touched. The parent
// node holds the object, so the pointer stays valid while the walk runs. Anything else (small
// strings, PODs, Any) goes through the field's getter.
const Object* Obj(const Object* obj, const TVMFFIFieldInfo* field) {
  if (field->size == sizeof(void*) &&
      field->field_static_type_index >= ffi::TypeIndex::kTVMFFIStaticObjectBegin &&
      field->field_static_type_index != ffi::TypeIndex::kTVMFFIStr &&
      field->field_static_type_index != ffi::TypeIndex::kTVMFFIBytes) {
    return *reinterpret_cast<const Object* const*>(reinterpret_cast<const char*>(obj) +
                                                   field->offset);
  }
  return ObjectOf(Read(obj, field));
}

// The items of an array field (none if it is unset).
struct Items {
  const Any* first = nullptr;
  const Any* last = nullptr;
  const Any* begin() const { return first; }
  const Any* end() const { return last; }
  size_t size() const { return static_cast<size_t>(last - first); }
  const Any& operator[](size_t i) const { return first[i]; }
};

Items ItemsOf(const Object* obj, const TVMFFIFieldInfo* field) {
  const Object* value = Obj(obj, field);
  if (value == nullptr) return {};
  if (value->type_index() != ffi::TypeIndex::kTVMFFIArray) {
    TVM_FFI_THROW(TypeError) << "expected an array in " << TypeKey(obj) << ", got "
                             << TypeKey(value);
  }
  const auto* array = static_cast<const ffi::ArrayObj*>(value);
  return {array->begin(), array->end()};
}

// One node type and the getters of the fields the walk reads.
struct Type {
  const char* key;
  int32_t index;
  explicit Type(const char* key) : key(key), index(TypeIndexOf(key)) {}
  const TVMFFIFieldInfo* operator[](const char* name) const {
    const TVMFFIFieldInfo* field = FindField(index, name);
    if (field == nullptr) {
      TVM_FFI_THROW(AttributeError) << "TVM's " << key << " has no field `" << name << "`";
    }
    return field;
  }
};

// The TIR this walker knows, every field resolved up front: a TVM whose IR differs fails here,
// once, with the field it misses.
struct Tir {
  Type func{"tirx.PrimFunc"}, stmt{"tirx.Stmt"}, seq{"tirx.SeqStmt"}, loop{"tirx.For"},
      branch{"tirx.IfThenElse"}, realize{"s_tir.SBlockRealize"}, block{"s_tir.SBlock"},
      iter_var{"tirx.IterVar"}, range{"ir.Range"}, region{"ir.TensorRegion"}, var{"ir.Var"},
      int_imm{"ir.IntImm"}, buffer_type{"tirx.BufferType"}, prim_type{"ir.PrimType"},
      module{"ir.IRModule"};
  const TVMFFIFieldInfo *func_params = func["params"], *func_body = func["body"],
                        *seq_seq = seq["seq"], *branch_then = branch["then_case"],
                        *branch_else = branch["else_case"], *loop_var = loop["loop_var"],
                        *loop_extent = loop["extent"], *loop_kind = loop["kind"],
                        *loop_body = loop["body"], *loop_binding = loop["thread_binding"],
                        *loop_annotations = loop["annotations"],
                        *realize_block = realize["block"],
                        *realize_values = realize["iter_values"],
                        *block_vars = block["iter_vars"], *block_reads = block["reads"],
                        *block_writes = block["writes"], *block_name = block["name_hint"],
                        *block_allocs = block["alloc_buffers"], *block_body = block["body"],
                        *iv_dom = iter_var["dom"], *iv_var = iter_var["var"],
                        *iv_type = iter_var["iter_type"], *iv_tag = iter_var["thread_tag"],
                        *range_min = range["min"], *range_extent = range["extent"],
                        *region_source = region["source"], *region_ranges = region["region"],
                        *var_ty = var["ty"], *var_name = var["name"],
                        *int_value = int_imm["value"], *buffer_dtype = buffer_type["dtype"],
                        *buffer_shape = buffer_type["shape"], *prim_dtype = prim_type["dtype"];
};

const Tir& TheTir() {
  static const Tir tir;
  return tir;
}

// ---- the features ------------------------------------------------------------------------------

// The columns this walk writes, by calo.schedule_graph.FEATURES' names (matched at each call).
#define CALO_COLUMNS(X)                                                                          \
  X(is_loop) X(is_block) X(is_buffer) X(log_extent) X(serial) X(parallel) X(vectorized)         \
  X(unrolled) X(thread_bound) X(log_unroll_step) X(depth) X(log_trip_count) X(log_bytes)        \
  X(scope_global) X(scope_local) X(scope_shared) X(is_reduction) X(thread_tag)                  \
  X(log_vector_width) X(innermost) X(log_inner_dim_accesses) X(log_accesses) X(rel_extent)      \
  X(rel_trip_count) X(rel_bytes) X(log_footprint) X(rel_footprint) X(log_core_trip_count)       \
  X(rel_core_trip_count) X(log_parallel_ways) X(log_vector_ops)
enum Column {
#define CALO_ENUM(name) k_##name,
  CALO_COLUMNS(CALO_ENUM)
#undef CALO_ENUM
  kNumColumns
};
constexpr const char* kColumnNames[] = {
#define CALO_NAME(name) #name,
    CALO_COLUMNS(CALO_NAME)
#undef CALO_NAME
};
constexpr Column kLoopKinds[] = {k_serial, k_parallel, k_vectorized, k_unrolled, k_thread_bound};
constexpr Column kDeviceColumns[] = {k_log_core_trip_count, k_rel_core_trip_count,
                                     k_log_parallel_ways, k_log_vector_ops};
constexpr const char* kThreadTags[] = {"blockIdx.x",  "blockIdx.y",  "blockIdx.z", "threadIdx.x",
                                       "threadIdx.y", "threadIdx.z", "vthread"};
enum Edge : int64_t { kNest = 0, kDataflow = 1, kSequence = 2, kFusion = 3 };

double Log(double value) { return std::log2(1.0 + std::max(value, 0.0)); }

int64_t FloorDiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

struct BufferInfo {
  std::string name;
  std::vector<float> row;
  std::vector<int64_t> shape;
  double elem_bytes;
};

struct Dim {
  std::vector<int64_t> loops;  // loop nodes driving this dimension
  int64_t extent;              // of one access
  int64_t size;                // of the buffer
};

// ---- the walk ----------------------------------------------------------------------------------

class Extractor {
 public:
  Extractor(const Array<ffi::String>& feature_names, int64_t cores, int64_t vector_bytes)
      : width_(static_cast<int>(feature_names.size())), cores_(cores),
        vector_bytes_(vector_bytes) {
    for (int c = 0; c < kNumColumns; ++c) {
      auto it = std::find(feature_names.begin(), feature_names.end(), kColumnNames[c]);
      if (it == feature_names.end()) {
        TVM_FFI_THROW(KeyError) << "no feature column `" << kColumnNames[c] << "`";
      }
      col_[c] = static_cast<int>(it - feature_names.begin());
    }
    storage_scope_ = ffi::Function::GetGlobalRequired("tirx.BufferStorageScope");
  }

  // One graph, appended to the outputs.
  void Extract(const Object* func, bool with_device) {
    if (!IsA(func, tir_.func.index)) {
      TVM_FFI_THROW(TypeError) << "expected a tirx.PrimFunc, got " << TypeKey(func);
    }
    first_row_ = x_.size();
    first_edge_ = src_.size();
    buffer_nodes_.clear();
    loop_of_var_.clear();
    enclosing_.clear();
    loops_ = 0;
    core_trips_ = 1;
    double elem_bytes = 4.0;
    for (const Any& param : ItemsOf(func, tir_.func_params)) {
      const Object* p = ObjectOf(param);
      if (p != nullptr && IsBuffer(p)) {
        BufferNode(p);
        elem_bytes = std::max(elem_bytes, Info(p).elem_bytes);
      }
    }
    vector_lanes_ = std::max<int64_t>(
        static_cast<int64_t>(std::floor(static_cast<double>(vector_bytes_) / elem_bytes)), 1);
    std::vector<int64_t> loop_blocks;
    Walk(Obj(func, tir_.func_body), -1, 0, 1, &loop_blocks);
    Normalize(with_device);
    nodes_.push_back(Rows());
    edges_.push_back(static_cast<int64_t>(src_.size() - first_edge_));
  }

  // Room for `graphs` graphs the size of those walked so far, and a quarter more: growing the
  // outputs as they fill copies them and faults in fresh pages each time.
  void Reserve(size_t graphs) {
    size_t walked = std::max<size_t>(nodes_.size(), 1);
    for (auto* v : {&src_, &dst_, &etype_}) v->reserve(v->size() * graphs * 5 / 4 / walked);
    x_.reserve(x_.size() * graphs * 5 / 4 / walked);
    nodes_.reserve(graphs);
    edges_.reserve(graphs);
  }

  // Another slice's graphs after this one's (node ids are local to their graph).
  void Append(const Extractor& other) {
    x_.insert(x_.end(), other.x_.begin(), other.x_.end());
    for (auto [to, from] : {std::pair{&src_, &other.src_}, {&dst_, &other.dst_},
                            {&etype_, &other.etype_}, {&nodes_, &other.nodes_},
                            {&edges_, &other.edges_}}) {
      to->insert(to->end(), from->begin(), from->end());
    }
  }

  Array<Any> Result() const {
    return {Bytes(x_), Bytes(src_), Bytes(dst_), Bytes(etype_), Bytes(nodes_), Bytes(edges_)};
  }

 private:
  template <typename T>
  static ffi::Bytes Bytes(const std::vector<T>& v) {
    return ffi::Bytes(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }

  // calo.schedule_graph._int: a static integer, 1 for anything symbolic.
  int64_t Int(const Any& value) const {
    if (value.type_index() == ffi::TypeIndex::kTVMFFIInt ||
        value.type_index() == ffi::TypeIndex::kTVMFFIBool) {
      return value.cast<int64_t>();
    }
    return Int(ObjectOf(value));
  }
  int64_t Int(const Object* expr) const {
    if (expr == nullptr || expr->type_index() != tir_.int_imm.index) return 1;
    if (tir_.int_value->size == sizeof(int64_t) &&
        tir_.int_value->field_static_type_index == ffi::TypeIndex::kTVMFFIInt) {
      return *reinterpret_cast<const int64_t*>(reinterpret_cast<const char*>(expr) +
                                               tir_.int_value->offset);
    }
    return Read(expr, tir_.int_value).cast<int64_t>();
  }

  bool IsBuffer(const Object* obj) const {
    if (obj->type_index() != tir_.var.index) return false;
    const Object* ty = Obj(obj, tir_.var_ty);
    return ty != nullptr && ty->type_index() == tir_.buffer_type.index;
  }

  // calo.schedule_graph._buffer_info
  const BufferInfo& Info(const Object* buf) {
    auto it = infos_.find(buf);
    if (it != infos_.end()) return it->second;
    const Object* ty = Obj(buf, tir_.var_ty);
    BufferInfo info;
    info.name = std::string(Read(buf, tir_.var_name).cast<ffi::String>());
    int64_t elems = 1;
    for (const Any& size : ItemsOf(ty, tir_.buffer_shape)) {
      info.shape.push_back(Int(size));
      elems *= info.shape.back();
    }
    // The element width is str(dtype)'s trailing digits (32 without), as the Python walker reads.
    std::string dtype(ffi::DLDataTypeToString(
        Read(Obj(ty, tir_.buffer_dtype), tir_.prim_dtype).cast<DLDataType>()));
    size_t digits = dtype.size();
    while (digits > 0 && std::isdigit(static_cast<unsigned char>(dtype[digits - 1]))) --digits;
    double width = digits < dtype.size() ? std::stod(dtype.substr(digits)) : 32.0;
    double nbytes = static_cast<double>(elems) * width / 8;
    std::string scope(storage_scope_(RefOf(buf)).cast<ffi::String>());
    info.row.assign(width_, 0.0f);
    info.row[col_[k_is_buffer]] = 1.0f;
    info.row[col_[k_log_extent]] = static_cast<float>(Log(static_cast<double>(elems)));
    info.row[col_[k_log_bytes]] = static_cast<float>(Log(nbytes));
    info.row[col_[k_scope_global]] = scope == "global";
    info.row[col_[k_scope_local]] = scope.rfind("local", 0) == 0;
    info.row[col_[k_scope_shared]] = scope.rfind("shared", 0) == 0;
    info.elem_bytes = nbytes / static_cast<double>(std::max<int64_t>(elems, 1));
    return infos_.emplace(buf, std::move(info)).first->second;
  }

  int64_t Rows() const { return static_cast<int64_t>((x_.size() - first_row_) / width_); }
  float& At(int64_t node, Column column) { return x_[first_row_ + node * width_ + col_[column]]; }

  int64_t BufferNode(const Object* buf) {
    const BufferInfo& info = Info(buf);
    auto it = buffer_nodes_.find(info.name);
    if (it != buffer_nodes_.end()) return it->second;
    x_.insert(x_.end(), info.row.begin(), info.row.end());
    return buffer_nodes_[info.name] = Rows() - 1;
  }
  int64_t Node() {
    x_.resize(x_.size() + width_, 0.0f);
    return Rows() - 1;
  }
  void Set(int64_t node, Column column, double value) {
    At(node, column) = static_cast<float>(value);
  }
  void AddEdge(int64_t a, int64_t b, Edge kind) {
    src_.push_back(a);
    dst_.push_back(b);
    etype_.push_back(kind);
  }
  // calo.schedule_graph._add_log: add to a count kept in log2(1 + x) units.
  void AddLog(int64_t node, Column column, double value) {
    float& cell = At(node, column);
    cell = static_cast<float>(Log(std::pow(2.0, static_cast<double>(cell)) - 1 + value));
  }

  // calo.schedule_graph._walk
  std::vector<int64_t> Walk(const Object* stmt, int64_t parent, int64_t depth, int64_t trips,
                            std::vector<int64_t>* loop_blocks) {
    if (stmt == nullptr) return {};
    int32_t type = stmt->type_index();
    if (type == tir_.realize.index) return WalkBlock(stmt, parent, depth, trips, loop_blocks);
    if (type == tir_.loop.index) return {WalkLoop(stmt, parent, depth, trips, loop_blocks)};
    if (type == tir_.seq.index) {
      std::vector<int64_t> heads;
      int64_t previous = -1;
      for (const Any& child : ItemsOf(stmt, tir_.seq_seq)) {
        std::vector<int64_t> produced = Walk(ObjectOf(child), parent, depth, trips, loop_blocks);
        if (!produced.empty()) {
          if (previous >= 0) AddEdge(previous, produced.front(), kSequence);
          previous = produced.back();
          heads.insert(heads.end(), produced.begin(), produced.end());
        }
      }
      return heads;
    }
    if (type == tir_.branch.index) {
      std::vector<int64_t> produced =
          Walk(Obj(stmt, tir_.branch_then), parent, depth, trips, loop_blocks);
      std::vector<int64_t> other =
          Walk(Obj(stmt, tir_.branch_else), parent, depth, trips, loop_blocks);
      produced.insert(produced.end(), other.begin(), other.end());
      return produced;
    }
    auto found = body_of_.find(type);
    if (found == body_of_.end()) found = body_of_.emplace(type, FindField(type, "body")).first;
    if (found->second != nullptr) {
      const Object* body = Obj(stmt, found->second);
      if (body != nullptr && IsA(body, tir_.stmt.index)) {
        return Walk(body, parent, depth, trips, loop_blocks);
      }
    }
    return {};
  }

  // calo.schedule_graph._walk_loop
  int64_t WalkLoop(const Object* loop, int64_t parent, int64_t depth, int64_t trips,
                   std::vector<int64_t>* loop_blocks) {
    int64_t extent = Int(Obj(loop, tir_.loop_extent));
    int64_t kind_index = Read(loop, tir_.loop_kind).cast<int64_t>();
    Column kind = kind_index >= 0 && kind_index < 5 ? kLoopKinds[kind_index] : k_serial;
    int64_t tag = 0;
    if (const Object* binding = Obj(loop, tir_.loop_binding)) {
      std::string name(Read(binding, tir_.iv_tag).cast<ffi::String>());
      for (int i = 0; i < 7; ++i) {
        if (name == kThreadTags[i]) tag = i + 1;
      }
    }
    int64_t unroll = 0;
    Any annotations = Read(loop, tir_.loop_annotations);
    if (ObjectOf(annotations) != nullptr) {
      auto map = annotations.cast<ffi::Map<ffi::String, Any>>();
      auto it = map.find("pragma_auto_unroll_max_step");
      if (it != map.end()) unroll = Int((*it).second);
    }
    int64_t ways = kind == k_parallel ? std::min(extent, cores_) : 1;
    int64_t lanes = kind == k_vectorized ? vector_lanes_ : 1;
    if (ways * lanes <= 0) {
      TVM_FFI_THROW(ValueError) << "a loop of extent " << extent << " over " << cores_
                                << " cores and " << vector_lanes_ << " vector lanes";
    }
    int64_t core_extent = -FloorDiv(-extent, ways * lanes);  // ceil: the busiest core's share
    int64_t node = Node();
    Set(node, k_is_loop, 1);
    Set(node, k_log_extent, Log(static_cast<double>(extent)));
    Set(node, k_depth, static_cast<double>(depth));
    Set(node, k_log_trip_count, Log(static_cast<double>(trips * extent)));
    Set(node, k_log_unroll_step, Log(static_cast<double>(unroll)));
    Set(node, k_thread_tag, static_cast<double>(tag));
    Set(node, k_log_vector_width, kind == k_vectorized ? Log(static_cast<double>(extent)) : 0.0);
    Set(node, k_log_core_trip_count, Log(static_cast<double>(core_trips_ * core_extent)));
    Set(node, k_log_parallel_ways, kind == k_parallel ? Log(static_cast<double>(ways)) : 0.0);
    Set(node, k_log_vector_ops,
        kind == k_vectorized ? Log(static_cast<double>(core_extent)) : 0.0);
    Set(node, kind, 1);
    if (parent >= 0) AddEdge(parent, node, kNest);
    loop_of_var_[Obj(loop, tir_.loop_var)] = node;
    loops_ += 1;
    std::vector<int64_t> inner_blocks;
    int64_t loops_before = loops_;
    enclosing_.emplace_back(node, extent);
    int64_t outer_core_trips = core_trips_;
    core_trips_ *= core_extent;
    Walk(Obj(loop, tir_.loop_body), node, depth + 1, trips * extent, &inner_blocks);
    enclosing_.pop_back();
    core_trips_ = outer_core_trips;
    Set(node, k_innermost, loops_ == loops_before ? 1.0 : 0.0);
    for (size_t i = 1; i < inner_blocks.size(); ++i) {
      AddEdge(inner_blocks[i - 1], inner_blocks[i], kFusion);
    }
    loop_blocks->insert(loop_blocks->end(), inner_blocks.begin(), inner_blocks.end());
    return node;
  }

  // calo.schedule_graph._walk_block
  std::vector<int64_t> WalkBlock(const Object* realize, int64_t parent, int64_t depth,
                                 int64_t trips, std::vector<int64_t>* loop_blocks) {
    const Object* block = Obj(realize, tir_.realize_block);
    for (const Any& buf : ItemsOf(block, tir_.block_allocs)) {
      BufferNode(ObjectOf(buf));
    }
    if (parent < 0 && Read(block, tir_.block_name).cast<ffi::String>() == "root") {
      return Walk(Obj(block, tir_.block_body), -1, depth, trips, loop_blocks);
    }
    auto iter_vars = ItemsOf(block, tir_.block_vars);
    auto reads = ItemsOf(block, tir_.block_reads);
    auto writes = ItemsOf(block, tir_.block_writes);
    int64_t domain = 1;
    bool reduction = false;
    for (const Any& iv : iter_vars) {
      const Object* var = ObjectOf(iv);
      domain *= Int(Obj(Obj(var, tir_.iv_dom), tir_.range_extent));
      reduction |= Read(var, tir_.iv_type).cast<int64_t>() == 2;  // CommReduce
    }
    int64_t node = Node();
    Set(node, k_is_block, 1);
    Set(node, k_log_extent, Log(static_cast<double>(domain)));
    Set(node, k_depth, static_cast<double>(depth));
    Set(node, k_log_trip_count, Log(static_cast<double>(trips)));
    Set(node, k_log_core_trip_count, Log(static_cast<double>(core_trips_)));
    Set(node, k_is_reduction, reduction ? 1.0 : 0.0);
    Set(node, k_log_accesses, Log(static_cast<double>(reads.size() + writes.size())));
    if (parent >= 0) AddEdge(parent, node, kNest);
    std::vector<const Object*> regions;
    for (const Any& r : reads) regions.push_back(ObjectOf(r));
    for (const Any& r : writes) regions.push_back(ObjectOf(r));
    MarkAccesses(iter_vars, ItemsOf(realize, tir_.realize_values), regions);
    for (size_t i = 0; i < reads.size(); ++i) {
      AddEdge(BufferNode(Obj(regions[i], tir_.region_source)), node, kDataflow);
    }
    for (size_t i = reads.size(); i < regions.size(); ++i) {
      AddEdge(node, BufferNode(Obj(regions[i], tir_.region_source)), kDataflow);
    }
    loop_blocks->push_back(node);
    Walk(Obj(block, tir_.block_body), node, depth + 1, trips, loop_blocks);
    return {node};
  }

  // calo.schedule_graph._vars: the variables an index expression reads, each once, in the
  // order TVM's undefined_vars finds them (operands in field order; spans and types skipped).
  void Vars(const Object* expr, std::vector<const Object*>* out) {
    if (expr == nullptr || expr->type_index() == tir_.int_imm.index) return;
    if (expr->type_index() == tir_.var.index) {
      if (std::find(out->begin(), out->end(), expr) == out->end()) out->push_back(expr);
      return;
    }
    for (const TVMFFIFieldInfo* field : OperandsOf(expr->type_index())) {
      const Object* value = Obj(expr, field);
      if (value != nullptr && value->type_index() == ffi::TypeIndex::kTVMFFIArray) {
        for (const Any& item : ItemsOf(expr, field)) Vars(ObjectOf(item), out);
      } else {
        Vars(value, out);
      }
    }
  }

  // The fields of an expression type that can hold a variable, base fields first: not its span,
  // type or operator, nor a plain value (a dtype, an integer) that no variable can be.
  const std::vector<const TVMFFIFieldInfo*>& OperandsOf(int32_t type) {
    if (static_cast<size_t>(type) >= operands_of_.size()) operands_of_.resize(type + 1);
    std::unique_ptr<std::vector<const TVMFFIFieldInfo*>>& found = operands_of_[type];
    if (found == nullptr) {
      found = std::make_unique<std::vector<const TVMFFIFieldInfo*>>();
      std::vector<const TVMFFITypeInfo*> chain;
      ForEachType(type, [&](const TVMFFITypeInfo* t) { chain.push_back(t); });
      for (auto t = chain.rbegin(); t != chain.rend(); ++t) {
        for (int32_t i = 0; i < (*t)->num_fields; ++i) {
          const TVMFFIFieldInfo& field = (*t)->fields[i];
          std::string_view name(field.name.data, field.name.size);
          bool plain = field.field_static_type_index >= 0 &&
                       field.field_static_type_index < ffi::TypeIndex::kTVMFFIStaticObjectBegin;
          if (name != "span" && name != "ty" && name != "op" && !plain) found->push_back(&field);
        }
      }
    }
    return *found;
  }

  // calo.schedule_graph._mark_accesses
  void MarkAccesses(const Items& iter_vars, const Items& iter_values,
                    const std::vector<const Object*>& regions) {
    std::vector<std::pair<const Object*, std::vector<int64_t>>> drivers;
    std::vector<const Object*> vars;
    for (size_t i = 0; i < std::min(iter_vars.size(), iter_values.size()); ++i) {
      vars.clear();
      Vars(ObjectOf(iter_values[i]), &vars);
      std::vector<int64_t> loops;
      for (const Object* v : vars) {
        auto it = loop_of_var_.find(v);
        if (it != loop_of_var_.end()) loops.push_back(it->second);
      }
      drivers.emplace_back(Obj(ObjectOf(iter_vars[i]), tir_.iv_var), std::move(loops));
    }
    std::vector<std::pair<int64_t, int64_t>> inner_dim;  // (loop node, uses), first use first
    std::vector<std::pair<std::string, std::vector<double>>> touched;  // bytes per loop
    size_t n = enclosing_.size();
    std::vector<Dim> dims;
    std::vector<double> spans;
    for (const Object* region : regions) {
      const BufferInfo& info = Info(Obj(region, tir_.region_source));
      dims.clear();
      auto ranges = ItemsOf(region, tir_.region_ranges);
      for (size_t d = 0; d < std::min(ranges.size(), info.shape.size()); ++d) {
        const Object* range = ObjectOf(ranges[d]);
        vars.clear();
        Vars(Obj(range, tir_.range_min), &vars);
        Dim dim{{}, Int(Obj(range, tir_.range_extent)), info.shape[d]};
        for (const Object* v : vars) {
          auto it = std::find_if(drivers.rbegin(), drivers.rend(),
                                 [&](const auto& p) { return p.first == v; });
          if (it != drivers.rend()) {
            dim.loops.insert(dim.loops.end(), it->second.begin(), it->second.end());
          }
        }
        dims.push_back(std::move(dim));
      }
      if (dims.empty()) continue;
      for (int64_t loop : dims.back().loops) {
        auto it = std::find_if(inner_dim.begin(), inner_dim.end(),
                               [&](const auto& p) { return p.first == loop; });
        if (it == inner_dim.end()) {
          inner_dim.emplace_back(loop, 1);
        } else {
          it->second += 1;
        }
      }
      spans.clear();
      for (const Dim& dim : dims) {
        spans.push_back(std::min(static_cast<double>(dim.extent), static_cast<double>(dim.size)));
      }
      double elems = 1;
      for (double span : spans) elems *= span;
      auto entry = std::find_if(touched.begin(), touched.end(),
                                [&](const auto& p) { return p.first == info.name; });
      if (entry == touched.end()) {
        touched.emplace_back(info.name, std::vector<double>(n, 0.0));
        entry = touched.end() - 1;
      }
      for (size_t k = n; k-- > 0;) {  // innermost loop first
        auto [loop, extent] = enclosing_[k];
        for (size_t d = 0; d < dims.size(); ++d) {
          double size = static_cast<double>(dims[d].size);
          if (spans[d] < size &&
              std::find(dims[d].loops.begin(), dims[d].loops.end(), loop) != dims[d].loops.end()) {
            double grown = std::min(spans[d] * static_cast<double>(extent), size);
            elems *= grown / spans[d];
            spans[d] = grown;
          }
        }
        entry->second[k] = std::max(entry->second[k], elems * info.elem_bytes);
      }
    }
    for (const auto& [loop, uses] : inner_dim) {
      AddLog(loop, k_log_inner_dim_accesses, static_cast<double>(uses));
    }
    for (size_t k = 0; k < n; ++k) {
      double total = 0;
      for (const auto& entry : touched) total += entry.second[k];
      AddLog(enclosing_[k].first, k_log_footprint, total);
    }
  }

  // calo.schedule_graph._normalize_per_workload, then the device columns cleared without one.
  void Normalize(bool with_device) {
    int64_t rows = Rows();
    auto largest = [&](Column kind, Column column) {
      double best = 0.0;
      bool any = false;
      for (int64_t r = 0; r < rows; ++r) {
        if (At(r, kind) == 1.0f) {
          double value = At(r, column);
          best = any ? std::max(best, value) : value;
          any = true;
        }
      }
      return std::max(best, 1.0);
    };
    double size = largest(k_is_block, k_log_extent);
    double buffer_extent = largest(k_is_buffer, k_log_extent);
    double buffer_bytes = largest(k_is_buffer, k_log_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      auto over = [&](Column column, double by) {
        return static_cast<float>(static_cast<double>(At(r, column)) / by);
      };
      At(r, k_rel_extent) = over(k_log_extent, At(r, k_is_buffer) == 1.0f ? buffer_extent : size);
      At(r, k_rel_trip_count) = over(k_log_trip_count, size);
      At(r, k_rel_core_trip_count) = over(k_log_core_trip_count, size);
      At(r, k_rel_bytes) = over(k_log_bytes, buffer_bytes);
      At(r, k_rel_footprint) = over(k_log_footprint, buffer_bytes);
      if (!with_device) {
        for (Column column : kDeviceColumns) At(r, column) = 0.0f;
      }
    }
  }

  const Tir& tir_ = TheTir();
  int col_[kNumColumns];
  int width_;
  int64_t cores_, vector_bytes_, vector_lanes_ = 1;
  ffi::Function storage_scope_;
  std::unordered_map<const Object*, BufferInfo> infos_;  // the call's funcs keep them alive
  std::unordered_map<int32_t, const TVMFFIFieldInfo*> body_of_;
  // By type index; each list behind a pointer, so that Vars can recurse (and grow this) while
  // it iterates over one.
  std::vector<std::unique_ptr<std::vector<const TVMFFIFieldInfo*>>> operands_of_;
  // the graph being walked
  size_t first_row_ = 0, first_edge_ = 0;
  std::unordered_map<std::string, int64_t> buffer_nodes_;
  std::unordered_map<const Object*, int64_t> loop_of_var_;
  std::vector<std::pair<int64_t, int64_t>> enclosing_;  // (loop node, extent), outermost first
  int64_t loops_ = 0, core_trips_ = 1;
  // all graphs
  std::vector<float> x_;
  std::vector<int64_t> src_, dst_, etype_, nodes_, edges_;
};

// The PrimFunc of each program: a search's candidates are read here, not one FFI call at a time
// from Python.
std::vector<ObjectRef> FuncsOf(const Array<ObjectRef>& programs) {
  const Tir& tir = TheTir();
  std::vector<ObjectRef> funcs;
  funcs.reserve(programs.size());
  std::optional<ffi::Function> get_mod, lookup;
  for (ObjectRef program : programs) {
    if (TypeKey(program.get()) == "s_tir.meta_schedule.MeasureCandidate") {
      if (!get_mod) get_mod = ffi::Function::GetGlobalRequired("s_tir.schedule.ScheduleGetMod");
      static const TVMFFIFieldInfo* sch = FindField(program->type_index(), "sch");
      if (sch == nullptr) {
        TVM_FFI_THROW(AttributeError) << "TVM's MeasureCandidate has no field `sch`";
      }
      program = (*get_mod)(Read(program.get(), sch)).cast<ObjectRef>();
    }
    if (program->type_index() == tir.module.index) {
      if (!lookup) lookup = ffi::Function::GetGlobalRequired("ir.Module_Lookup_str");
      program = (*lookup)(program, "main").cast<ObjectRef>();
    }
    funcs.push_back(std::move(program));
  }
  return funcs;
}

// The graphs of programs, walked by up to `threads` threads over contiguous slices (TVM's nodes
// are only read; reference counts are atomic), joined in order. Built with OpenMP, the threads
// are the OpenMP runtime's that torch already runs (one libgomp.so.1 per process): after a
// forward, its workers spin awake for milliseconds, and threads of our own would share the
// cores with them.
Array<Any> ExtractGraphs(const Array<ObjectRef>& programs,
                         const Array<ffi::String>& feature_names,
                         int64_t cores, int64_t vector_bytes, bool with_device,
                         int64_t threads) {
  std::vector<ObjectRef> funcs = FuncsOf(programs);
  size_t n = funcs.size();
  size_t parts = static_cast<size_t>(std::clamp<int64_t>(threads, 1, std::max<size_t>(n, 1)));
  std::vector<Extractor> slices;
  for (size_t p = 0; p < parts; ++p) slices.emplace_back(feature_names, cores, vector_bytes);
  std::vector<std::exception_ptr> errors(parts);
  auto run = [&](size_t p) {
    try {
      size_t first = n * p / parts, end = n * (p + 1) / parts;
      for (size_t i = first; i < end; ++i) {
        slices[p].Extract(funcs[i].get(), with_device);
        if (i == first) slices[p].Reserve(end - first);
      }
    } catch (...) {
      errors[p] = std::current_exception();
    }
  };
#ifdef _OPENMP
#pragma omp parallel for schedule(static, 1) num_threads(static_cast<int>(parts))
  for (size_t p = 0; p < parts; ++p) run(p);
#else
  std::vector<std::thread> workers;
  for (size_t p = 1; p < parts; ++p) workers.emplace_back(run, p);
  run(0);
  for (std::thread& worker : workers) worker.join();
#endif
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
  for (size_t p = 1; p < parts; ++p) slices[0].Append(slices[p]);
  return slices[0].Result();
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(extract_graphs, ExtractGraphs);
