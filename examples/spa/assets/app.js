// A tiny client-side router: every path below is served index.html by the gateway's
// SPA fallback, and this script decides what to show.
"use strict";

const views = [
  [/^\/$/, () => "<h2>Home</h2><p>Served by edgegw with single-page-app fallback.</p>"],
  [/^\/about$/, () => "<h2>About</h2><p>Reload this page: the gateway still serves the app.</p>"],
  [/^\/users\/([^/]+)$/, (id) => `<h2>User ${encodeURIComponent(id)}</h2><p>A client-side route.</p>`],
];

function render() {
  const path = window.location.pathname;
  const view = document.getElementById("view");
  for (const [pattern, show] of views) {
    const found = path.match(pattern);
    if (found) {
      view.innerHTML = show(...found.slice(1));
      return;
    }
  }
  view.innerHTML = "<h2>Not found</h2><p>No client-side route for this path.</p>";
}

document.addEventListener("click", (event) => {
  const link = event.target.closest("a[data-link]");
  if (link) {
    event.preventDefault();
    window.history.pushState({}, "", link.getAttribute("href"));
    render();
  }
});
window.addEventListener("popstate", render);

fetch("/healthz")
  .then((response) => response.json())
  .then((body) => { document.getElementById("health").textContent = body.status; })
  .catch(() => { document.getElementById("health").textContent = "unreachable"; });

render();
