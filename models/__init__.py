"""Pure torch/PyG: the evidential model, its loss, calibration and training loop
(installed as calo.models)."""
