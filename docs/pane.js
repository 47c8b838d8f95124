// Loaded by every page of the site (docs/CMakeLists.txt adds it to Doxygen's header).
// In a pane of the side-by-side reader (reader.html: the page is in a frame named fa-notes
// or fa-source; the name stays while the pane goes from page to page), the page
// drops Doxygen's header, search box and navigation tree (style.css: html.fa-pane), so the
// pane's width goes to the text; and a link to a source listing (a code quote's file label,
// a "source:" link, an #include in a listing) opens in the reader's source pane, at the
// line it names, instead of replacing this pane.
(function () {
  if (window.self === window.top || !/^fa-(notes|source)$/.test(window.name)) return;
  document.documentElement.classList.add("fa-pane");
  document.addEventListener("click", function (e) {
    var a = e.target && e.target.closest ? e.target.closest("a[href]") : null;
    if (!a || e.ctrlKey || e.metaKey || e.shiftKey) return;
    var href = a.getAttribute("href");
    if (!/^[^:#\/]*_source\.html(#.*)?$/.test(href)) return;
    e.preventDefault();
    window.parent.postMessage({fa: "source", href: href}, "*");
  });
})();
