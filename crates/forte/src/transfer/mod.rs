//! Moving objects over the network: connecting to the relay, retrying, uploading (send) and
//! downloading (pull).

pub mod download;
pub mod retry;
pub mod tune;
pub mod upload;
