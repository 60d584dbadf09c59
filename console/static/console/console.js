// The top bar's Cluster selector: choosing a cluster reloads the current page with ?cluster=<id> (the server stores
// the choice in the login session and redirects back without the parameter). The page number is dropped: the
// narrowed list pages differently. Without JavaScript the form's own submit button does the same.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var select = document.querySelector("select[data-console-cluster]");
  if (!select) return;
  select.addEventListener("change", function () {
    var url = new URL(window.location.href);
    url.searchParams.set("cluster", select.value);
    url.searchParams.delete("p");
    window.location.assign(url.toString());
  });
});

// The new-volume form: what the entered size costs a month, from the price in micro-credits (integers only, so the
// shown amount is exact; the server renders the same sentence once a size was submitted).
document.addEventListener("DOMContentLoaded", function () {
  var cost = document.querySelector("[data-gs-storage-cost]");
  var input = document.getElementById("id_quota_gb");
  if (!cost || !input || typeof BigInt === "undefined") return;
  var micro = BigInt(cost.getAttribute("data-gs-price-micro"));
  function show() {
    var text = input.value.trim();
    if (!/^[1-9][0-9]{0,15}$/.test(text)) { cost.textContent = ""; return; }
    var total = micro * BigInt(text);
    var fraction = (total % 1000000n).toString().padStart(6, "0");
    cost.textContent = ": " + text + " GiB cost " + (total / 1000000n).toString() + "." + fraction + " credits a month";
  }
  input.addEventListener("input", show);
});
