//! What the watcher costs and what room it has: its own resident memory and CPU time (from
//! `/proc/<pid>`), and the free space on the project's file system (`statvfs`), with the
//! threshold below which the status warns that the disk is filling up.
//!
//! Read from `/proc` and `statvfs` rather than through `sysinfo`: these three numbers are a
//! few hundred bytes of reads, while `sysinfo` keeps tables of every process and disk.
//!
//! [`release_free_memory`] hands the allocator's free pages, the executable's code pages and
//! the pages of the pack files libgit2 mapped back to the system once a pass is over, so a
//! watcher's resident memory is what it keeps, not the peak of its last pass, the code of its
//! start-up, nor the objects it last read.

use std::fs;
use std::path::Path;

/// Overrides the free-space threshold (a size as `--max-file-size` reads it: `100GiB`,
/// `1048576`; an unreadable value leaves the default). Documented for
/// operators who want an earlier or later warning, and used by tests to make it fire.
pub const MIN_FREE_DISK_ENV: &str = "PROJECT_WATCHER_MIN_FREE_DISK";

/// The status warns below max(512 MiB, 5 % of the file system).
const MIN_FREE_FLOOR: u64 = 512 * 1024 * 1024;
const MIN_FREE_PERCENT: u64 = 5;

/// Returns the memory a finished pass leaves behind to the system: called when a pass is over
/// (start-up, a quiet index write).
///
/// - The allocator's free pages (glibc's `malloc_trim`, which also releases free pages inside
///   each thread's arena): a walk's short-lived paths are freed between the long-lived index
///   entries and watches allocated beside them; glibc keeps such holes resident otherwise.
/// - The executable's code and read-only data pages ([`release_code_pages`]): start-up runs
///   most of the binary once (the command line, the logger, the walk, libgit2's setup), and
///   those pages stayed mapped for the life of the daemon, the larger part of its resident
///   memory. Unmapped, they stay in the page cache, and the next save maps back the ones it
///   runs (minor faults).
/// - The pages of the pack files libgit2 keeps mapped ([`release_pack_pages`]): a save reads
///   trees and the pack index through them, and they stayed resident between saves (7.3 MiB
///   of a quiet watcher's 33 MiB at 100k tracked files).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
pub(crate) fn release_free_memory() {
    // SAFETY: `malloc_trim` takes each arena's lock itself and only returns pages that hold
    // no allocation; it reads and writes no memory of ours.
    unsafe {
        libc::malloc_trim(0);
    }
    release_code_pages();
    release_pack_pages();
}

/// Reclaims the resident pages of the read-only mappings of the repository's pack files
/// (`.pack`, `.idx` and the multi-pack index under `objects/pack/`, the commit graph under
/// `objects/info/`) with `MADV_PAGEOUT`, which takes them out of this process and, when no
/// other process maps them, out of the page cache; the next read maps them back from the
/// file. Unlike `MADV_DONTNEED`, it never discards data, whatever is mapped at the address:
/// libgit2 may unmap a window on another thread (the push worker drops its repository)
/// between the read of `/proc/self/maps` and the advice, and whatever is mapped there next
/// is at most paged out. Kernels before 5.4, and files in memory (tmpfs) with no swap, keep
/// the pages.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn release_pack_pages() {
    let Ok(maps) = fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for (start, end) in maps.lines().filter_map(pack_mapping) {
        // SAFETY: `MADV_PAGEOUT` only reclaims pages: their contents stay what they were
        // (written back or read again), so no memory of the program changes, whatever the
        // range holds by now. A failure changes nothing, so it is ignored.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_PAGEOUT);
        }
    }
}

/// The address range of a line of `/proc/<pid>/maps` when it maps, read-only, a file of a
/// repository's object store that libgit2 maps (packs, their indexes, the commit graph).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn pack_mapping(line: &str) -> Option<(usize, usize)> {
    let mut fields = line.splitn(6, ' ');
    let range = fields.next()?;
    let perms = fields.next()?;
    let path = fields.nth(3)?.trim_start();
    let object_store = path.contains("/objects/pack/") || path.contains("/objects/info/");
    if perms.contains('w') || !object_store {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    (end > start).then_some((start, end))
}

/// Unmaps the resident pages of the executable's read-only segments (`PT_LOAD` without
/// `PF_W`: code, constants, unwinding tables) with `MADV_DONTNEED`. Those pages are the file's
/// own bytes, never written (relocated data lives in the writable segment, `PT_GNU_RELRO`
/// included, which is left alone), so a later access maps the same bytes again from the page
/// cache: nothing the program sees changes. Only whole pages inside a segment are advised.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn release_code_pages() {
    unsafe extern "C" fn executable_only(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        _data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: glibc passes a valid `dl_phdr_info` whose `dlpi_phdr` holds `dlpi_phnum`
        // program headers, for the duration of this call.
        let info = unsafe { &*info };
        let page = rustix::param::page_size();
        for i in 0..usize::from(info.dlpi_phnum) {
            // SAFETY: `i < dlpi_phnum` (see above).
            let header = unsafe { &*info.dlpi_phdr.add(i) };
            if header.p_type != libc::PT_LOAD || header.p_flags & libc::PF_W != 0 {
                continue;
            }
            let start = (info.dlpi_addr as usize + header.p_vaddr as usize).next_multiple_of(page);
            let end = (info.dlpi_addr as usize + (header.p_vaddr + header.p_memsz) as usize) / page
                * page;
            if end > start {
                // SAFETY: the range lies inside a read-only segment of this executable, which
                // stays mapped for the life of the process; `MADV_DONTNEED` on a private file
                // mapping that was never written only drops page table entries, and the next
                // access reads the file's same bytes. A failure changes nothing, so it is
                // ignored.
                unsafe {
                    libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
                }
            }
        }
        // The executable is the first object glibc reports; the shared libraries' pages are
        // shared with every other process that maps them.
        1
    }
    // SAFETY: the callback only reads what glibc hands it and advises pages of the
    // executable's read-only segments (see above).
    unsafe {
        libc::dl_iterate_phdr(Some(executable_only), std::ptr::null_mut());
    }
}

/// Other allocators return free memory on their own terms.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn release_free_memory() {}

/// A process's resident memory (bytes) and CPU time (user + system, milliseconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcessUsage {
    pub(crate) rss_bytes: u64,
    pub(crate) cpu_ms: u64,
}

/// Reads `/proc/<pid>/status` (`VmRSS`) and `/proc/<pid>/stat` (`utime`, `stime`); `None`
/// when the process is gone.
pub(crate) fn process(pid: u32) -> Option<ProcessUsage> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after `(comm)`, which may hold spaces: utime and stime are fields 14 and 15.
    let after = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Some(ProcessUsage {
        rss_bytes: rss_kib * 1024,
        cpu_ms: ticks * 1000 / per_second,
    })
}

/// Space on a file system, in bytes: `free` is what an unprivileged writer can still use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DiskSpace {
    pub(crate) free: u64,
    pub(crate) total: u64,
}

/// The file system holding `path`.
pub(crate) fn disk(path: &Path) -> Option<DiskSpace> {
    let vfs = rustix::fs::statvfs(path).ok()?;
    Some(DiskSpace {
        free: vfs.f_bavail.saturating_mul(vfs.f_frsize),
        total: vfs.f_blocks.saturating_mul(vfs.f_frsize),
    })
}

/// The free space below which the status warns: [`MIN_FREE_DISK_ENV`] when set and valid,
/// else max(512 MiB, 5 % of `total`).
pub(crate) fn min_free(total: u64) -> u64 {
    std::env::var(MIN_FREE_DISK_ENV)
        .ok()
        .and_then(|v| crate::config::parse_size(&v).ok())
        .unwrap_or_else(|| default_min_free(total))
}

fn default_min_free(total: u64) -> u64 {
    MIN_FREE_FLOOR.max(total / 100 * MIN_FREE_PERCENT)
}

/// The warning the status carries when `space` is below `min_free`.
pub(crate) fn disk_warning(space: DiskSpace, min_free: u64) -> Option<String> {
    (space.free < min_free).then(|| {
        format!(
            "the project's file system is nearly full: {} free of {} (warning below {}); saves fail once it is full",
            human_bytes(space.free),
            human_bytes(space.total),
            human_bytes(min_free)
        )
    })
}

/// `1.5 GiB`, `300.0 MiB`, `12 bytes`.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1024 * 1024 * 1024;

    #[test]
    fn the_threshold_is_512_mib_or_5_percent_whichever_is_more() {
        assert_eq!(default_min_free(4 * GIB), 512 * 1024 * 1024);
        assert_eq!(default_min_free(100 * GIB), 5 * GIB);
    }

    #[test]
    fn the_warning_comes_below_the_threshold_only() {
        let space = DiskSpace {
            free: 300 * 1024 * 1024,
            total: 8 * GIB,
        };
        let warning = disk_warning(space, default_min_free(space.total)).unwrap();
        assert!(
            warning.contains("300.0 MiB free of 8.0 GiB (warning below 512.0 MiB)"),
            "{warning}"
        );
        assert_eq!(disk_warning(space, space.free), None);
        assert!(disk_warning(space, space.free + 1).is_some());
    }

    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn only_read_only_mappings_of_the_object_store_are_pack_pages() {
        let pack = "7f4e4c000000-7f4e4c497000 r--s 00000000 fe:00 2097 \
                    /p/.git/objects/pack/pack-50c6.pack";
        assert_eq!(
            pack_mapping(pack),
            Some((0x7f4e_4c00_0000, 0x7f4e_4c49_7000))
        );
        let spaced = "1000-3000 r--p 00000000 fe:00 2098   /my project/.git/objects/pack/p.idx";
        assert_eq!(pack_mapping(spaced), Some((0x1000, 0x3000)));
        let graph = "1000-2000 r--p 00000000 fe:00 2099 /p/.git/objects/info/commit-graph";
        assert_eq!(pack_mapping(graph), Some((0x1000, 0x2000)));
        for other in [
            "1000-2000 rw-p 00000000 fe:00 2097 /p/.git/objects/pack/pack-1.pack",
            "1000-2000 r--p 00000000 fe:00 77 /usr/lib/x86_64-linux-gnu/libc.so.6",
            "1000-2000 rw-p 00000000 00:00 0 ",
            "1000-2000 rw-p 00000000 00:00 0",
            "7ffd0000-7ffd2000 rw-p 00000000 00:00 0 [stack]",
            "2000-1000 r--p 00000000 fe:00 2097 /p/.git/objects/pack/pack-1.pack",
        ] {
            assert_eq!(pack_mapping(other), None, "{other}");
        }
    }

    #[test]
    fn this_process_and_its_file_system_are_measured() {
        let usage = process(std::process::id()).unwrap();
        assert!(usage.rss_bytes > 1024 * 1024, "{usage:?}");
        let space = disk(Path::new(".")).unwrap();
        assert!(space.total > 0 && space.free <= space.total, "{space:?}");
        assert_eq!(process(u32::MAX), None);
    }
}
