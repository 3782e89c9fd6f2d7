//! The fault-injection suite: the failures a fault-injection run found (issue 18), each kept as
//! a test so it stays fixed. One module per kind of fault:
//! - `io`: outputs that are device nodes or FIFOs, inputs that are FIFOs, devices or huge files;
//! - `overhead`: the self-reported overhead of a session with lost records, against `/proc`;
//! - `backoff`: the daemon's export backoff with its collector down and its queue full;
//! - `memory`: the daemon's memory while hundreds of distinct binaries come and go;
//! - `children`: short-lived children of `profile -- CMD`, named though they have exited;
//! - `decode`: small profile files that would decode into gigabytes;
//! - `modules`: module files whose debug sections would make the symbolizer allocate without bound.

mod backoff;
mod children;
mod decode;
mod io;
mod memory;
mod modules;
mod overhead;
