// clodex console: refresh the live region every 3 s, confirm actions.
// No inline script anywhere: the Content-Security-Policy allows only
// this file.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (live && live.dataset.src) {
    var busy = false;
    setInterval(function () {
      if (busy || document.hidden) return;
      busy = true;
      fetch(live.dataset.src, { credentials: "same-origin", cache: "no-store" })
        .then(function (r) {
          if (r.status === 401) { location.reload(); return null; }
          return r.ok ? r.text() : null;
        })
        .then(function (html) { if (html) live.innerHTML = html; })
        .catch(function () {})
        .finally(function () { busy = false; });
    }, 3000);
  }
  document.addEventListener("submit", function (e) {
    var b = e.submitter || e.target.querySelector("[data-confirm]");
    var msg = b && b.getAttribute("data-confirm");
    if (msg && !window.confirm(msg)) e.preventDefault();
  });
})();
