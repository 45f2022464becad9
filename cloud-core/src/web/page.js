// The workspace page's only script: the status follows the server's events without a reload,
// the history is read again after each change, and restoring a version asks first.
(function () {
  "use strict";
  var main = document.getElementById("workspace");
  if (!main) {
    return;
  }
  var base = "/u/" + encodeURIComponent(main.dataset.user);
  var status = document.getElementById("status");
  var history = document.getElementById("history");

  document.addEventListener("submit", function (event) {
    var form = event.target;
    if (form.classList.contains("restore-version") &&
        !window.confirm("Restore this version? Edits not saved yet are saved first, and the restore is a new save you can undo.")) {
      event.preventDefault();
    }
  });

  function refreshHistory() {
    fetch(base + "/history", { credentials: "same-origin", cache: "no-store" })
      .then(function (response) { return response.ok ? response.text() : null; })
      .then(function (html) { if (html !== null) { history.innerHTML = html; } })
      .catch(function () {});
  }

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
    refreshHistory();
  });
})();
