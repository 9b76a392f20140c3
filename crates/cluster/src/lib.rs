//! Cluster restore planning (HotRestore, section 4): who talks to whom, the restore
//! dependency graph, and the restore line.

pub mod line;
pub mod pcap;
pub mod rdg;
pub mod traffic;
