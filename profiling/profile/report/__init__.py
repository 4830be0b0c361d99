"""Stage 5, pure: one trace (or a folder of ranks) into the summary of every table and finding, its Markdown and
JSON, the changes since an earlier profile, the profile's folder, the out-of-memory line and `research profile`."""
