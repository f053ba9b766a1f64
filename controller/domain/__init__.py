"""Shared vocabulary of the controller: model, fabric, parallelism, errors. Imports nothing above
it."""
