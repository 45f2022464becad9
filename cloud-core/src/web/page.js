// The workspace page's only script: the status and the history follow the server's events
// without a reload, a restore's outcome is shown when it is known, times read as "3 min ago"
// with the local time on hover, a sync's or a restore's time so far ticks, and restoring asks
// first.
(function () {
  "use strict";

  document.addEventListener("submit", function (event) {
    var form = event.target;
    var question = form.classList.contains("restore-version")
      ? "Restore this version? Edits not saved yet are saved first, and the restore is a new save you can undo."
      : form.classList.contains("restore-file")
        ? "Restore only this file as it was in this save? Edits not saved yet are saved first, and the restore is a new save you can undo."
        : null;
    if (question !== null && !window.confirm(question)) {
      event.preventDefault();
    }
  });

  function ago(seconds) {
    if (seconds < 45) { return "just now"; }
    var minutes = Math.round(seconds / 60);
    if (minutes < 60) { return minutes + " min ago"; }
    var hours = Math.round(minutes / 60);
    if (hours < 24) { return hours + (hours === 1 ? " hour ago" : " hours ago"); }
    var days = Math.round(hours / 24);
    return days + (days === 1 ? " day ago" : " days ago");
  }

  function localizeTimes(root) {
    var times = root.querySelectorAll("time[datetime]:not(#status-elapsed)");
    for (var i = 0; i < times.length; i++) {
      var at = new Date(times[i].getAttribute("datetime"));
      if (isNaN(at.getTime())) { continue; }
      times[i].title = at.toLocaleString();
      times[i].textContent = ago(Math.max(0, (Date.now() - at.getTime()) / 1000));
    }
  }
  localizeTimes(document);
  window.setInterval(function () { localizeTimes(document); }, 30000);

  // The same words as the server's first rendering (view.rs `elapsed_since`).
  function elapsed(seconds) {
    if (seconds < 60) { return seconds + " s"; }
    if (seconds < 3600) { return Math.floor(seconds / 60) + " min " + (seconds % 60) + " s"; }
    return Math.floor(seconds / 3600) + " h " + (Math.floor(seconds / 60) % 60) + " min";
  }
  window.setInterval(function () {
    var since = document.getElementById("status-elapsed");
    var began = since ? new Date(since.getAttribute("datetime")).getTime() : NaN;
    if (!isNaN(began)) {
      since.textContent = elapsed(Math.max(0, Math.floor((Date.now() - began) / 1000)));
    }
  }, 1000);

  // A copy button copies its box's text; where the clipboard is refused, the text is selected
  // for the reader's own Ctrl+C.
  document.addEventListener("click", function (event) {
    var button = event.target.closest ? event.target.closest("button.copy") : null;
    var box = button ? document.getElementById(button.dataset.copy) : null;
    if (!box) {
      return;
    }
    var select = function () {
      var range = document.createRange();
      range.selectNodeContents(box);
      var selection = window.getSelection();
      selection.removeAllRanges();
      selection.addRange(range);
      button.textContent = "Selected: press Ctrl+C";
    };
    if (!navigator.clipboard) {
      select();
      return;
    }
    navigator.clipboard.writeText(box.textContent).then(function () {
      button.textContent = "Copied";
    }, select);
  });

  var main = document.getElementById("workspace");
  if (!main) {
    return;
  }
  var base = "/u/" + encodeURIComponent(main.dataset.user);
  var status = document.getElementById("status");
  var history = document.getElementById("history");

  function showNotice(text) {
    var notice = document.getElementById("notice");
    if (!notice) {
      notice = document.createElement("p");
      notice.id = "notice";
      notice.setAttribute("role", "alert");
      status.parentNode.insertBefore(notice, status);
    }
    notice.textContent = text;
  }

  // On this page a restore is sent from the page, which stays: its event stream says how it
  // went.
  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (event.defaultPrevented || !form.classList.contains("restore-version")) {
      return;
    }
    event.preventDefault();
    showNotice("Restoring…");
    fetch(form.action, {
      method: "POST",
      credentials: "same-origin",
      redirect: "manual",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
      body: new URLSearchParams(new FormData(form)).toString()
    }).then(function (response) {
      if (response.type === "opaqueredirect" || response.ok) {
        return;
      }
      return response.text().then(function (html) {
        var page = new DOMParser().parseFromString(html, "text/html");
        var why = page.getElementById("message");
        showNotice(why ? why.textContent : "The restore was refused.");
      });
    }).catch(function () {
      showNotice("The restore could not be sent: check your connection and try again.");
    });
  });

  var events = new EventSource(base + "/events");
  events.addEventListener("status", function (event) {
    var next = document.createElement("div");
    next.innerHTML = event.data;
    // The same state again (the first event after connecting): keep the page as it is, with
    // what is typed in the form and the errors next to its fields.
    var label = function (root) {
      var badge = root.querySelector(".status");
      return badge ? badge.textContent : "";
    };
    if (label(next) === label(status)) {
      return;
    }
    status.innerHTML = event.data;
  });
  events.addEventListener("history", function (event) {
    history.innerHTML = event.data;
    localizeTimes(history);
  });
  events.addEventListener("notice", function (event) {
    showNotice(event.data);
  });
})();
