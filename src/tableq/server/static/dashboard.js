// The dashboard's only script: confirmations for destructive forms, and a periodic refresh
// of the numbers and charts. It writes text only (textContent), never HTML.
(function () {
  "use strict";
  document.querySelectorAll("form[data-confirm]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      if (!window.confirm(form.dataset.confirm)) { event.preventDefault(); }
    });
  });
  var root = document.querySelector("[data-refresh]");
  if (!root) { return; }
  var every = parseInt(root.dataset.interval, 10) || 5000;
  function refresh() {
    fetch(root.dataset.refresh, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data) { return; }
        document.querySelectorAll("[data-field]").forEach(function (el) {
          var value = data.fields[el.dataset.field];
          if (value !== undefined && el.textContent !== value) { el.textContent = value; }
        });
        document.querySelectorAll("img[data-chart]").forEach(function (img) {
          img.src = img.dataset.chart + "&t=" + Date.now();
        });
      })
      .catch(function () { /* the next refresh tries again */ });
  }
  window.setInterval(refresh, every);
})();
