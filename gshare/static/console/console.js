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
