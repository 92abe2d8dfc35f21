//! The relay's wire protocol, version 1.
//!
//! | method | path | who | does |
//! |---|---|---|---|
//! | PUT | `/v1/objects/{id}/parts/{index}` | edge | store a sealed part; header `x-forte-sha256` is checked before answering |
//! | GET | `/v1/objects/{id}` | edge | which parts of the object the relay holds, and its state |
//! | PUT | `/v1/objects/{id}` | edge | seal the object: its sealed manifest and part list ([`Seal`]) |
//! | POST | `/v1/objects/status` | edge | the state of many objects at once ([`StatusQuery`]) |
//! | POST | `/v1/batches/{batch}/cancel` | edge | cancel a batch: delete these of its objects ([`BatchAck`]) that are not delivered, and its seal; answers [`Cancelled`] |
//! | PUT | `/v1/batches/{batch}` | edge | the batch is complete: these are all its objects, and its sealed inventory ([`BatchSeal`]) |
//! | GET | `/v1/ready` | core | objects of complete batches waiting for pull ([`ReadyObject`]); `?open=true` adds sealed objects of batches still being sent |
//! | GET | `/v1/sites/{site}/batches/{batch}/inventory` | core | the batch's sealed inventory (404: none, the batch was sealed by an edge before object format 2) |
//! | GET | `/v1/sites/{site}/objects/{id}/manifest` | core | the sealed manifest |
//! | GET | `/v1/sites/{site}/objects/{id}/parts/{index}` | core | a sealed part |
//! | POST | `/v1/sites/{site}/objects/{id}/parts/{index}/reject` | core | report a damaged part: the relay drops it |
//! | POST | `/v1/sites/{site}/objects/{id}/manifest/reject` | core | report a damaged manifest: the relay drops it and reopens the object |
//! | POST | `/v1/sites/{site}/batches/{batch}/ack` | core | acknowledge a whole batch ([`BatchAck`], with the core's signed receipt): its objects leave the listing together, then are deleted; the receipt is kept for the edge |
//! | GET | `/v1/batches/{batch}/receipts` | edge | the core's signed receipts for the batch ([`Receipts`]); the edge deletes sources only under one it verifies |
//! | GET | `/v1/site` | edge | the site the token belongs to ([`SiteAnswer`]) |
//! | GET | `/metrics` | core | Prometheus counters: parts and bytes stored, objects and batches sealed, acknowledgements, rejections, refusals by status |
//!
//! Every request carries `Authorization: Bearer <token>`. An edge token belongs to one site and
//! sees only that site's objects; a core token lists the sites it may pull.

use forte_format::ObjectId;
use serde::{Deserialize, Serialize};

/// Header carrying the SHA-256 (lower-case hex) of a request body.
pub const SHA256_HEADER: &str = "x-forte-sha256";

/// `PUT /v1/objects/{id}/whole?batch=B` stores and seals a one-part object in one request (one
/// round trip instead of two): the body is the part followed by the sealed manifest, this
/// header gives the manifest's length and [`SHA256_HEADER`] the part's SHA-256.
pub const MANIFEST_LENGTH_HEADER: &str = "x-forte-manifest-length";

/// Header of an upload's answer while the relay holds the site to a share of its ingress
/// (two or more sites sending): the site's bytes per second. The sender's tuner takes it as a
/// limit that binds, rather than as a link that stopped paying.
pub const SHARE_HEADER: &str = "x-forte-share";

/// Query of `PUT /v1/objects/{id}/whole`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WholeQuery {
    pub batch: String,
}

/// The largest request body the relay accepts: a 16 MiB part sealed, with room for larger
/// configured part sizes. Bigger bodies get 413.
pub const MAX_BODY: usize = 1 << 30;

/// The largest JSON body of a small request (statuses, cancellation, a rejected part or
/// manifest): a thousand ids, with room.
pub const MAX_SMALL_JSON: usize = 1 << 20;

/// The largest body of an acknowledgement: the ids of a batch's objects (some 35 bytes each)
/// and the core's receipt (at most 64 MiB, in base64), with room.
pub const MAX_ACK_JSON: usize = 160 << 20;

/// The largest body of an object's seal: its parts and its sealed manifest (at most 128 MiB,
/// in base64), with room.
pub const MAX_SEAL_JSON: usize = 200 << 20;

/// The largest body of a batch's seal: its object ids and its sealed inventory (at most
/// 256 MiB, in base64), with room.
pub const MAX_BATCH_SEAL_JSON: usize = 400 << 20;

/// A stored part as the relay sees it: a hash and a length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartRef {
    pub index: u32,
    pub sha256: String,
    pub length: u64,
}

/// The state of one object at the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectState {
    /// Parts arriving; not sealed yet (or a part was rejected since).
    Open,
    /// Sealed: every part and the manifest are present and waiting for pull.
    Complete,
    /// The core acknowledged delivery; the data is gone from the relay.
    Delivered,
}

/// Answer to `GET /v1/objects/{id}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectStatus {
    pub state: ObjectState,
    pub parts: Vec<PartRef>,
}

/// Body of `PUT /v1/batches/{batch}`: every object of the batch, each already sealed (or
/// delivered). Only then are the batch's objects offered to the core, so a batch arrives whole.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchSeal {
    pub objects: Vec<ObjectId>,
    /// The batch's inventory (`forte_format::Inventory`), signed by the edge and encrypted to
    /// the core, standard base64: the relay stores it for the core, which delivers the batch
    /// only if the objects it got are exactly those listed. Absent from edges before object
    /// format 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inventory: Option<String>,
}

/// Query of `PUT /v1/batches/{batch}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BatchSealQuery {
    /// Wait up to this long (at most [`MAX_WAIT_MS`]) for listed objects still being uploaded
    /// to be sealed, instead of refusing the seal at once: the edge sends the seal beside its
    /// last uploads, not a round trip after them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// Body of `POST /v1/sites/{site}/batches/{batch}/ack`: the objects the core delivered (and of
/// `POST /v1/batches/{batch}/cancel`: the objects the edge cancels). The
/// relay records them first, so that from then on none of them is listed, even if it stops
/// before deleting them all: a batch is never offered again with some of its objects gone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BatchAck {
    pub objects: Vec<ObjectId>,
    /// The core's signed custody receipt for the batch instance (`forte_format::Receipt`),
    /// standard base64; kept by the relay for the edge. Absent from cancellations and from
    /// cores before receipts: then no source is deleted on the relay's word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<String>,
}

/// Answer of `GET /v1/batches/{batch}/receipts`: every receipt the relay keeps for the batch
/// (one per delivered instance: a follow-up is another), standard base64 each.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Receipts {
    pub receipts: Vec<String>,
}

/// Answer of `GET /v1/site`: the site an edge token belongs to.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SiteAnswer {
    pub site: String,
}

/// The most bytes of a JSON answer a client reads (listings, statuses, receipts): past it
/// the answer is refused, whatever the relay sends.
pub const MAX_JSON_ANSWER: u64 = 256 << 20;

/// Answer of `POST /v1/batches/{batch}/cancel`: what the relay deleted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cancelled {
    pub objects: usize,
    pub bytes: u64,
}

/// Body of `POST /v1/objects/status`: at most [`MAX_STATUS_QUERY`] ids. The answer maps each
/// id the relay has heard of to its [`ObjectStatus`]; ids it has not are left out. Also the
/// body of `POST /v1/objects/abandon`: the edge gives up those of the ids that are open
/// (never sealed), and the answer is a [`Cancelled`] of what went.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusQuery {
    pub ids: Vec<ObjectId>,
}

/// The most ids one status query may ask about.
pub const MAX_STATUS_QUERY: usize = 1000;

/// Body of `PUT /v1/objects/{id}`: completes an object.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Seal {
    /// An opaque batch id: objects of one batch are pulled together.
    pub batch: String,
    /// Every part, in order; the relay must hold each with exactly this hash and length.
    pub parts: Vec<PartRef>,
    /// The sealed manifest (`manifest.age`), standard base64.
    pub manifest: String,
}

/// One entry of `GET /v1/ready`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadyObject {
    pub site: String,
    pub id: ObjectId,
    pub batch: String,
    pub parts: Vec<PartRef>,
    /// Seconds since the Unix epoch when the object was sealed.
    pub sealed_at: u64,
    /// Whether the object's batch is sealed (complete). Only with `?open=true` are objects of
    /// batches still being sent listed, for the core to fetch and verify ahead.
    #[serde(default)]
    pub batch_sealed: bool,
}

/// Query of `GET /v1/ready`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReadyQuery {
    /// Also list sealed objects of batches not sealed yet.
    #[serde(default)]
    pub open: bool,
    /// Long poll: answer only once something was sealed after the listing that answered with
    /// this generation ([`GENERATION_HEADER`]), or after `wait_ms`, whichever comes first. A
    /// watching core learns of a sealed object or batch at once instead of at its next poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// The header of a `GET /v1/ready` answer that counts the seals (objects and batches) the relay
/// has taken since it started, of the sites the token pulls only; pass it back as `after` to
/// wait for the next one.
pub const GENERATION_HEADER: &str = "x-forte-generation";

/// The longest a long poll of `GET /v1/ready` waits.
pub const MAX_WAIT_MS: u64 = 60_000;

/// The JSON body of every error answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
    /// Set when an upload or seal was refused because the relay holds the object already in
    /// this state (sealed, or delivered): nothing was replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<ObjectState>,
}

/// Site names: 1–64 of `[A-Za-z0-9._-]`, not starting with a dot. They name directories.
pub fn valid_site(site: &str) -> bool {
    !site.is_empty()
        && site.len() <= 64
        && !site.starts_with('.')
        && site
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Batch ids follow the same rule as site names.
pub fn valid_batch(batch: &str) -> bool {
    valid_site(batch)
}

/// The largest part index the relay accepts (a 16 TiB file in 16 MiB parts).
pub const MAX_PART_INDEX: u32 = 1 << 20;
