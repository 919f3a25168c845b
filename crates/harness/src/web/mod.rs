//! The `promptforge/web` Plugin (chapter 13). So far: the fetch policy's URL and address rules
//! ([`policy`]), the part every fetch, real or scripted, runs before it touches the network.
//! The transport, the fetch pipeline and search come next (issue 9).

pub mod policy;
