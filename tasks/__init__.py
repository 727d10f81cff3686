"""The pipeline's stages, one module each (installed as calo.tasks)."""
