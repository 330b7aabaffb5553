// MathJax 2 for the site, served from the site itself (assets/mathjax, copied by
// docs/tools/hooks.py from the jupyter-server-mathjax package): nothing is fetched from the internet.
// It typesets the markdown pages' math (pymdownx.arithmatex writes \( \) and \[ \]) and the
// notebooks' markdown cells ($ and $$, as Jupyter does). Set before MathJax.js loads.
window.MathJax = {
  tex2jax: {
    inlineMath: [["$", "$"], ["\\(", "\\)"]],
    displayMath: [["$$", "$$"], ["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true,
    skipTags: ["script", "noscript", "style", "textarea", "pre", "code"],
  },
  // the only web font the package ships; no image fonts
  "HTML-CSS": {availableFonts: [], webFont: "STIX-Web", imageFont: null},
  showMathMenu: false,
  messageStyle: "none",
};
