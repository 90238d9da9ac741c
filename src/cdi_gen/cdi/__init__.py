"""The CDI side: spec models, version rules, validation, codec, the one builder, the one
writer, and the spec folders as a runtime sees them (like the CDI Go library's pkg/cdi).
"""
