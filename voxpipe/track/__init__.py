"""MLflow tracking, registry and run comparison.

mlflow is imported only inside these modules (and only when a track step runs), so the other
steps never pay for it.
"""
