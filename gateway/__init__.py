"""Tide gateway: the FastAPI job API (arrives with the job-service issue). Never imports torch."""
