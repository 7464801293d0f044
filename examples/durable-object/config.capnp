# Runs the example locally with workerd: PROVIDER_URL=… MODEL=… API_KEY=… npx workerd serve config.capnp
# (dsh.mjs from dist/ beside this file). Sessions are kept in memory; for disk, use
# durableObjectStorage = (localDisk = "sessions") with a disk service named "sessions".
using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "main", worker = .worker),
    # "local" lets the worker reach a model server on 127.0.0.1 (as the tests do); "public" the internet.
    (name = "net", network = (allow = ["public", "local"])),
  ],
  sockets = [(name = "http", address = "127.0.0.1:8080", http = (), service = "main")],
);

const worker :Workerd.Worker = (
  modules = [
    (name = "worker.mjs", esModule = embed "worker.mjs"),
    (name = "store.mjs", esModule = embed "store.mjs"),
    (name = "dsh.mjs", esModule = embed "dsh.mjs"),
  ],
  compatibilityDate = "2025-09-01",
  durableObjectNamespaces = [(className = "SessionObject", uniqueKey = "dsh-sessions")],
  durableObjectStorage = (inMemory = void),
  bindings = [
    (name = "SESSIONS", durableObjectNamespace = "SessionObject"),
    (name = "PROVIDER_URL", fromEnvironment = "PROVIDER_URL"),
    (name = "MODEL", fromEnvironment = "MODEL"),
    (name = "API_KEY", fromEnvironment = "API_KEY"),
    (name = "CONTEXT_WINDOW", fromEnvironment = "CONTEXT_WINDOW"),
  ],
  globalOutbound = "net",
);
