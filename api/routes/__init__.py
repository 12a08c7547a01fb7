"""The HTTP routes, one ``APIRouter`` per resource, included by :func:`api.app.create_app`."""
