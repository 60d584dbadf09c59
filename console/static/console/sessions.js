/* The console's session pages (no framework, no CDN).
 * - A session page marked data-gs-follow polls its status URL every 2 s while the session is queued, on its way (or
 *   stopping) and reloads once the phase changes, so Open and Stop appear when it runs; a queued session's position,
 *   estimated start and reason are updated in place.
 * - The Start session form: its submit button is disabled after the first click (the form's idempotency key
 *   makes a second submit harmless anyway), the share fields dim while "Whole GPUs" is chosen, and the CPU and
 *   memory fields (data-gs-per-gpu: the policy's default per GPU) follow the GPU count until they are edited. */
(function () {
  "use strict";

  function follow(section) {
    var url = section.getAttribute("data-gs-follow");
    var phase = section.getAttribute("data-gs-phase");
    var badge = document.getElementById("gs-phase");
    var message = document.getElementById("gs-message");
    function poll() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" }, cache: "no-store" })
        .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
        .then(function (s) {
          if (message) { message.textContent = s.message || ""; }
          var position = document.getElementById("gs-queue-position");
          var estimate = document.getElementById("gs-queue-estimate");
          var waiting = document.getElementById("gs-queue-waiting");
          if (position) { position.textContent = s.queue_position || "?"; }
          if (estimate) { estimate.textContent = s.estimated_start || "(no estimate)"; }
          if (waiting) { waiting.textContent = s.waiting_for || ""; }
          if (s.phase !== phase) { window.location.reload(); return; }
          if (s.follow) { window.setTimeout(poll, 2000); }
        })
        .catch(function () { window.setTimeout(poll, 4000); });
    }
    if (badge) { badge.setAttribute("aria-live", "polite"); }
    window.setTimeout(poll, 2000);
  }

  function startForm(form) {
    var body = document.body;
    function shade() {
      var whole = form.querySelector("input[name=share][value=whole]");
      body.classList.toggle("gs-whole", Boolean(whole && whole.checked));
    }
    form.addEventListener("change", shade);
    shade();
    var gpus = form.querySelector("input[name=gpus]");
    var sized = Array.prototype.slice.call(form.querySelectorAll("[data-gs-per-gpu]"));
    function scaled(input) {
      var n = parseInt(gpus.value, 10);
      var per = parseFloat(input.getAttribute("data-gs-per-gpu"));
      // Thousandths: what the service keeps (3 decimal places); String() drops trailing zeros.
      return n >= 1 && per > 0 ? String(Math.round(per * n * 1000) / 1000) : null;
    }
    sized.forEach(function (input) {
      // Follows the GPU count while it holds the default for it (a re-shown form keeps what was typed).
      input.setAttribute("data-gs-auto", input.value === scaled(input) ? "1" : "0");
      input.addEventListener("input", function () { input.setAttribute("data-gs-auto", "0"); });
    });
    if (gpus) {
      gpus.addEventListener("input", function () {
        sized.forEach(function (input) {
          var value = scaled(input);
          if (input.getAttribute("data-gs-auto") === "1" && value !== null) { input.value = value; }
        });
      });
    }
    form.addEventListener("submit", function () {
      var button = form.querySelector("[data-gs-once]");
      if (button) { window.setTimeout(function () { button.disabled = true; }, 0); }
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var section = document.querySelector("[data-gs-follow]");
    if (section) { follow(section); }
    var form = document.getElementById("gs-start-form");
    if (form) { startForm(form); }
  });
})();
