//! The shared cluster token: see the `rebound-token` crate, which the HA backup's TCP
//! listener uses too.

pub use rebound_token::{ClusterToken, TokenError, MAX_TOKEN_LEN, MIN_TOKEN_LEN};
