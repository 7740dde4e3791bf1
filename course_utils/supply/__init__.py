"""What a lesson is given: models, data, the LLM, paths, modes and the section record, errors, the setup cell."""
