//! git's smart-protocol framing, in one place for both sides of a push: the cloud's proxy
//! reads pushes as they stream through, the watcher writes its own and reads the answers.
//!
//! Pure: no IO, no allocation beyond one partial packet per decoder. Every parser is fed chunk
//! by chunk and never panics on garbage.

pub mod advertisement;
pub mod pkt_line;
pub mod report_status;
