"""Router mode (`serve --models-dir DIR`, llama-server's): one HTTP server in front of every model
in a folder, each loaded on demand in a process of its own and reached by the `model` a request
names (catalog: what the folder holds; instances: the processes, their states and the LRU limit;
routes: the router's own API and the proxy; main: binding, signals and shutdown)."""
