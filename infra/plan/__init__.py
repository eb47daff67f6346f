"""Devices, model shapes, the cost model and the planner. Torch-free and pure."""
