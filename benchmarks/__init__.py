"""Benchmarks: ratios against torch and torchdata, measured side by side in one run.

Run ``python -m benchmarks --help`` inside the project's virtualenv.
"""
