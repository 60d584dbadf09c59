// Copy buttons of the console (data-copy="<text>"): the Clipboard API, which browsers allow on https and on
// localhost; elsewhere the text next to the button is selected so Ctrl+C copies it.
(function () {
  "use strict";
  function flash(button, text) {
    var label = button.dataset.label || button.textContent;
    button.dataset.label = label;
    button.textContent = text;
    button.classList.add("gs-copied");
    window.setTimeout(function () { button.textContent = label; button.classList.remove("gs-copied"); }, 1500);
  }
  function selectBeside(button) {
    var code = button.parentElement && button.parentElement.querySelector("code");
    if (!code) { return; }
    code.textContent = button.dataset.copy;
    var range = document.createRange();
    range.selectNodeContents(code);
    var selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }
  document.addEventListener("click", function (event) {
    var button = event.target.closest("[data-copy]");
    if (!button) { return; }
    event.preventDefault();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(button.dataset.copy).then(
        function () { flash(button, "Copied"); },
        function () { selectBeside(button); flash(button, "Press Ctrl+C"); }
      );
    } else {
      selectBeside(button);
      flash(button, "Press Ctrl+C");
    }
  });
})();
