"""Request schemas, public shapes, submission, files, storage, Celery and webhooks."""
