# Turn a source's documentation comments (`///`, `//!`, `/** */`, `/*! */`) into plain ones,
# keeping every line, for what Doxygen parses (Doxyfile FILTER_PATTERNS). The site shows
# the sources as annotated listings and makes no page per class, namespace or file: with
# nothing documented, Doxygen writes none. The listings themselves are filtered by
# strip_lab_markers.sed only (FILTER_SOURCE_PATTERNS), so they show the comments as written.
s|///*<*|//|g
s|//!<*|//|g
s|/\*\*\**<*|/*|g
s|/\*!<*|/*|g
