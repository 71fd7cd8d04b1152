// zsched ui: the console's only script (vendored, no build step, no CDN). Progressive: every page
// works without it; it refreshes the overview and a requeue's progress in place, fills in the browser's time zone next to
// date-time pickers (and a pre-filled picker's time in that zone), shows every time in that zone on hover, drops a
// shown ?msg= from the address bar, selects all dead letters, and asks before destructive actions.
(function () {
  "use strict";
  var tz = "UTC";
  try { tz = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC"; } catch (e) { /* keep UTC */ }
  document.querySelectorAll("input.tz").forEach(function (el) { if (!el.value || el.value === "UTC") { el.value = tz; } });
  document.querySelectorAll(".tz-label").forEach(function (el) { el.textContent = tz; });
  var pad = function (n) { return (n < 10 ? "0" : "") + n; };
  // a picker pre-filled by the server (data-utc: the UTC time it holds) is shown in the browser's zone, which its
  // form's tz field now names; without this script it holds the UTC digits and its tz field says UTC
  document.querySelectorAll("input[data-utc]").forEach(function (el) {
    var d = new Date(el.getAttribute("data-utc"));
    if (isNaN(d.getTime())) { return; }
    var utc = tz === "UTC";
    el.value = (utc ? d.getUTCFullYear() : d.getFullYear()) + "-" + pad((utc ? d.getUTCMonth() : d.getMonth()) + 1) + "-" +
      pad(utc ? d.getUTCDate() : d.getDate()) + "T" + pad(utc ? d.getUTCHours() : d.getHours()) + ":" +
      pad(utc ? d.getUTCMinutes() : d.getMinutes()) + ":" + pad(utc ? d.getUTCSeconds() : d.getSeconds());
  });
  // every time shown (in UTC, with its relative time) gets the viewer's own zone as its hover text
  var localTimes = function (root) {
    root.querySelectorAll("time[datetime]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d.getTime())) { return; }
      var text;
      try {
        text = d.toLocaleString(undefined, { timeZone: tz, timeZoneName: "short", hour12: false,
          year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", second: "2-digit" });
      } catch (e) { text = d.toString(); }
      el.setAttribute("title", text + " (" + tz + ")");
    });
  };
  localTimes(document);
  // a message shown after an action (?msg=...&sig=...) leaves the address: a reload or a bookmark does not show it again
  if (window.history && window.history.replaceState && window.URLSearchParams) {
    var query = new URLSearchParams(window.location.search);
    if (query.has("msg") || query.has("sig")) {
      query.delete("msg");
      query.delete("sig");
      var rest = query.toString();
      window.history.replaceState(window.history.state, "", window.location.pathname + (rest ? "?" + rest : "") +
        window.location.hash);
    }
  }

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
        .then(function (html) {
          box.innerHTML = html;
          localTimes(box);
          box.setAttribute("data-refreshed", String(Date.now()));
        })
        .catch(function () { box.setAttribute("data-refresh-error", String(Date.now())); })
        .finally(function () { window.setTimeout(refresh, period); });
    };
    window.setTimeout(refresh, period);
  });
})();
