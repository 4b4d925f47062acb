"""Kubeflow pipelines built from components/ (finetune.py) and their compiled YAML."""
