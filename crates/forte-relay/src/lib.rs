//! The relay in the DMZ and how to talk to it.
//!
//! The relay stores ciphertext only: sealed parts and sealed manifests, under opaque object ids,
//! grouped by site. It never holds a key that decrypts them. Edges (`forte send`) upload with
//! their site's token; the core (`forte pull`, which connects from inside, as firewalls allow
//! only internal → DMZ) lists complete objects, downloads them, and acknowledges delivery, after
//! which, and only after which, the relay deletes them.
//!
//! - [`api`]: the wire protocol shared by server and client (paths, headers, JSON bodies).
//! - [`server`]: the HTTPS server (`forte relay`).
//! - [`client`]: a blocking client for the sender's and puller's worker threads.
//! - [`tls`]: certificates: self-signed generation, fingerprint pinning.

pub mod api;
pub mod client;
pub mod pace;
pub mod server;
pub mod tls;
