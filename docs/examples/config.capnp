using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    # workerd refuses private addresses by default; "local" admits the model server on 127.0.0.1.
    (name = "net", network = (allow = ["public", "local"])),
  ],
  sockets = [(name = "http", address = "127.0.0.1:8080", http = (), service = "main")],
);

const worker :Workerd.Worker = (
  modules = [
    (name = "worker.mjs", esModule = embed "worker.mjs"),
    (name = "dsh.mjs", esModule = embed "dsh.mjs"),
  ],
  bindings = [(name = "MODEL_URL", text = "http://127.0.0.1:8000/v1")],
  compatibilityDate = "2025-09-01",
  globalOutbound = "net",
);
