# Blank the lab-marker lines (`// LAB BEGIN: <region> — hint: ...` and `// LAB END`) of a
# stage source, keeping every other line and so every line number. Used by the docs
# (Doxyfile INPUT_FILTER); the lab generator reads the markers from the unfiltered file.
s|^[[:space:]]*//[[:space:]]*LAB BEGIN:.*$||
s|^[[:space:]]*//[[:space:]]*LAB END[[:space:]]*$||
