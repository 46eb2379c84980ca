"""YAML presets (models/, memory/): installed as `hermes.configs` package data."""
