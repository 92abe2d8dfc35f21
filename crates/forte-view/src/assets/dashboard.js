// forte's dashboard: keeps a page live. The server renders every page whole (it reads without
// JavaScript); here a page that names a stream in <body data-live> replaces its sections with
// the ones each server-sent event carries ({"id": html, ..., "updated": time}).
"use strict";

(function () {
  const body = document.body;
  const stream = body.dataset.live;
  const state = document.getElementById("live-state");
  if (!stream || typeof EventSource === "undefined") {
    return;
  }
  const say = (text, cls) => {
    if (state) {
      state.textContent = text;
      state.className = cls;
    }
  };
  say("(connecting)", "muted");
  const source = new EventSource(stream);
  let events = 0;
  source.addEventListener("sections", (message) => {
    const sections = JSON.parse(message.data);
    for (const [id, html] of Object.entries(sections)) {
      if (id === "updated") {
        const time = document.getElementById("updated");
        if (time) time.textContent = html;
        continue;
      }
      const section = document.getElementById(id);
      if (section && section.innerHTML !== html) section.innerHTML = html;
    }
    events += 1;
    body.dataset.events = String(events);
    say("live", "live");
  });
  source.addEventListener("error", (message) => {
    // An "error" event from the server carries its text; one from the browser, none.
    if (message.data) {
      say("(" + JSON.parse(message.data).error + ")", "bad");
    } else {
      say("(reconnecting)", "muted");
    }
  });
  // The utilisation chart is an image: fetch it again every 30 s.
  const chart = document.getElementById("utilisation");
  if (chart) {
    setInterval(() => {
      const url = new URL(chart.src, location.href);
      url.searchParams.set("at", String(Date.now()));
      chart.src = url.toString();
    }, 30000);
  }
})();
