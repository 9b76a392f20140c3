//! Replication of a transactional heap to a backup process (issue 3).
//!
//! A primary ends each transaction by diffing its written pages against the last
//! committed state ([`diff_pages`]) and shipping the changed byte runs with a commit
//! record ([`ReplicaClient::commit`]). A backup ([`BackupServer`], the `rebound-ha backup`
//! command) applies each transaction atomically to its replica, logs it to a write-ahead
//! log before acknowledging it, and hands the committed image to a new primary that
//! takes over ([`ReplicaClient::attach`]). Epochs fence an old primary after a promote or
//! takeover.
//!
//! Modules, in the order data flows: [`diff`] → [`wire`] (frames, caps) → [`client`] →
//! [`server`] → [`replica`] (the acceptance rules) → [`store`] (image file and log).

pub mod auth;
pub mod client;
pub mod diff;
pub mod endpoint;
pub mod replica;
pub mod server;
pub mod spin;
pub mod store;
pub mod wire;

pub use client::{
    admin_options, promote, promote_with, query_status, query_status_with, ClientOptions,
    ClientStats, Error, OnFailure, ReplicaClient, TOKEN_FILE_ENV,
};
pub use diff::{diff_pages, prefetch_page, DiffRun};
pub use endpoint::Endpoint;
pub use rebound_token::ClusterToken;
pub use server::{BackupConfig, BackupHandle, BackupServer};
pub use spin::Spin;
pub use wire::{Mode, StatusInfo};
