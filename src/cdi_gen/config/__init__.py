"""The agent's configuration: the class config file (models, templates, the embedded
catalogue) and the settings of a run.
"""
