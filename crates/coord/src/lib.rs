//! The cluster restore protocol (HotRestore, section 4.3): a coordinator and one
//! cohort per host exchange LOAD, LOAD_FIN, START, START_FIN and RESTORE_FIN.
