"""The service layer: the ``dpgov`` command line now, the FastAPI app and scheduler later."""
