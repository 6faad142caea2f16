// ductwork dashboard: refreshes the parts of a page marked data-live every
// <body data-refresh> seconds, by fetching the same URL and swapping them in; no
// framework, no build step. It pauses while the tab is hidden, while the
// "refresh" box is unticked and while a field inside a live part has the focus;
// it reloads the whole page when a live part's data-reload-when changes (a run
// that became dampened or halted gets its action form). The server escapes every
// value; parsed with DOMParser, the fetched page runs no script.
(function () {
  "use strict";
  var every = Number(document.body.dataset.refresh || 0) * 1000;
  if (!every || !document.querySelector("[data-live]")) { return; }
  var toggle = document.getElementById("live-toggle");

  function busy() {
    var active = document.activeElement;
    return active && active.closest && active.closest("[data-live]") &&
      /^(INPUT|TEXTAREA|SELECT)$/.test(active.tagName);
  }

  function swap(fresh) {
    var reload = false;
    document.querySelectorAll("[data-live]").forEach(function (here) {
      var there = here.id && fresh.getElementById(here.id);
      if (!there) { return; }
      if (here.dataset.reloadWhen !== undefined && here.dataset.reloadWhen !== there.dataset.reloadWhen) {
        reload = true;
      }
      var open = {};
      here.querySelectorAll("details[data-id]").forEach(function (d) { open[d.dataset.id] = d.open; });
      there.querySelectorAll("details[data-id]").forEach(function (d) {
        if (open.hasOwnProperty(d.dataset.id)) { d.open = open[d.dataset.id]; }
      });
      here.replaceWith(document.adoptNode(there));
    });
    if (reload) { location.reload(); }
  }

  function tick() {
    if (document.hidden || (toggle && !toggle.checked) || busy()) { return later(); }
    fetch(location.href, {credentials: "same-origin", headers: {"Accept": "text/html"}})
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) {
        if (html) { swap(new DOMParser().parseFromString(html, "text/html")); }
      })
      .catch(function () { /* the server is away: try again at the next tick */ })
      .then(later);
  }

  function later() { window.setTimeout(tick, every); }
  later();
}());
