"""Prefect flows that run dvc.yaml's stages (installed as calo.flows)."""
