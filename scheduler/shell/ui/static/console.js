// zsched ui: the console's only script (vendored, no build step, no CDN). Progressive: every page
// works without it; it refreshes the overview and a requeue's progress in place, fills in the browser's time zone next to
// date-time pickers, selects all dead letters, and asks before destructive actions.
(function () {
  "use strict";
  var tz = "UTC";
  try { tz = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC"; } catch (e) { /* keep UTC */ }
  document.querySelectorAll("input.tz").forEach(function (el) { if (!el.value || el.value === "UTC") { el.value = tz; } });
  document.querySelectorAll(".tz-label").forEach(function (el) { el.textContent = tz; });

  var all = document.getElementById("select-all");
  if (all) {
    all.addEventListener("change", function () {
      document.querySelectorAll("input.pick").forEach(function (el) { el.checked = all.checked; });
    });
  }
  document.querySelectorAll("form.confirm").forEach(function (form) {
    form.addEventListener("submit", function (ev) {
      if (!window.confirm(form.getAttribute("data-confirm") || "Sure?")) { ev.preventDefault(); }
    });
  });

  var period = parseInt(document.body.getAttribute("data-refresh-ms") || "3000", 10);
  // #overview and a requeue's progress (.refresh) reload their fragment (data-src) in place
  document.querySelectorAll("#overview, .refresh").forEach(function (box) {
    if (!(period > 0)) { return; }
    var refresh = function () {
      fetch(box.getAttribute("data-src"), { credentials: "same-origin", cache: "no-store" })
        .then(function (r) { if (!r.ok) { throw new Error(r.status); } return r.text(); })
        .then(function (html) { box.innerHTML = html; box.setAttribute("data-refreshed", String(Date.now())); })
        .catch(function () { box.setAttribute("data-refresh-error", String(Date.now())); })
        .finally(function () { window.setTimeout(refresh, period); });
    };
    window.setTimeout(refresh, period);
  });
})();
