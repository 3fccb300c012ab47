// Served at /sw.js, where llama-server's web UI registers its service worker. A browser that ran
// llama-server's page at this address keeps that worker, and it would go on serving the cached
// llama-server page here. Browsers check /sw.js for an update on navigation; they get this
// script, which clears those caches and unregisters itself, so this server's page loads. This
// page never registers a worker of its own.
self.addEventListener("install", () => self.skipWaiting());
self.addEventListener("activate", (event) => {
  event.waitUntil((async () => {
    for (const key of await caches.keys()) await caches.delete(key);
    await self.registration.unregister();
    for (const client of await self.clients.matchAll({ type: "window" })) client.navigate(client.url);
  })());
});
