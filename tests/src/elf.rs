//! What an ELF executable asks of the host to run: a program interpreter (the dynamic loader) and shared
//! libraries. A static binary asks for neither. Only 64-bit little-endian ELF is read, the only kind built here.

/// The run-time needs of one executable.
#[derive(Debug, PartialEq, Eq)]
pub struct Linkage {
    /// `PT_INTERP`: the loader the kernel starts first, e.g. `/lib64/ld-linux-x86-64.so.2`.
    pub interpreter: Option<String>,
    /// `DT_NEEDED`: the shared libraries the loader maps.
    pub needed: Vec<String>,
}

const PT_DYNAMIC: u32 = 2;
const PT_INTERP: u32 = 3;
const PT_LOAD: u32 = 1;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;

/// Reads the linkage of the ELF64 LE image `elf`.
pub fn linkage(elf: &[u8]) -> Result<Linkage, String> {
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let phoff = u64_at(elf, 0x20)? as usize;
    let phentsize = u16_at(elf, 0x36)? as usize;
    let phnum = u16_at(elf, 0x38)? as usize;
    let headers: Vec<&[u8]> = (0..phnum)
        .map(|i| elf.get(phoff + i * phentsize..phoff + (i + 1) * phentsize).ok_or("truncated program header"))
        .collect::<Result<_, _>>()?;
    let kind = |h: &[u8]| u32_at(h, 0);
    let offset = |h: &[u8]| u64_at(h, 0x08).map(|v| v as usize);
    let size = |h: &[u8]| u64_at(h, 0x20).map(|v| v as usize);

    let mut interpreter = None;
    let mut needed = Vec::new();
    for h in &headers {
        match kind(h)? {
            PT_INTERP => {
                let bytes = elf.get(offset(h)?..offset(h)? + size(h)?).ok_or("truncated PT_INTERP")?;
                interpreter = Some(String::from_utf8_lossy(bytes).trim_end_matches('\0').to_string());
            }
            PT_DYNAMIC => needed = needed_libraries(elf, &headers, offset(h)?, size(h)?)?,
            _ => {}
        }
    }
    Ok(Linkage { interpreter, needed })
}

// The dynamic section's DT_NEEDED entries are offsets into the string table, which DT_STRTAB gives as a
// virtual address: mapped back to a file offset through the PT_LOAD segment that holds it.
fn needed_libraries(elf: &[u8], headers: &[&[u8]], at: usize, len: usize) -> Result<Vec<String>, String> {
    let section = elf.get(at..at + len).ok_or("truncated PT_DYNAMIC")?;
    let entries: Vec<(u64, u64)> = section
        .chunks_exact(16)
        .map(|e| Ok((u64_at(e, 0)?, u64_at(e, 8)?)))
        .collect::<Result<Vec<_>, String>>()?
        .into_iter()
        .take_while(|(tag, _)| *tag != DT_NULL)
        .collect();
    let names: Vec<u64> = entries.iter().filter(|(t, _)| *t == DT_NEEDED).map(|(_, v)| *v).collect();
    if names.is_empty() {
        return Ok(Vec::new());
    }
    let strtab = entries.iter().find(|(t, _)| *t == DT_STRTAB).ok_or("DT_NEEDED without DT_STRTAB")?.1;
    let file_offset = headers
        .iter()
        .filter(|h| u32_at(h, 0) == Ok(PT_LOAD))
        .find_map(|h| {
            let (off, vaddr, filesz) = (u64_at(h, 0x08).ok()?, u64_at(h, 0x10).ok()?, u64_at(h, 0x20).ok()?);
            (vaddr..vaddr + filesz).contains(&strtab).then(|| (strtab - vaddr + off) as usize)
        })
        .ok_or("DT_STRTAB in no PT_LOAD segment")?;
    names
        .into_iter()
        .map(|n| {
            let start = file_offset + n as usize;
            let rest = elf.get(start..).ok_or("DT_NEEDED name out of the file")?;
            let end = rest.iter().position(|b| *b == 0).ok_or("unterminated DT_NEEDED name")?;
            Ok(String::from_utf8_lossy(&rest[..end]).into_owned())
        })
        .collect()
}

fn u16_at(b: &[u8], at: usize) -> Result<u16, String> {
    Ok(u16::from_le_bytes(b.get(at..at + 2).ok_or("truncated ELF header")?.try_into().unwrap()))
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, String> {
    Ok(u32::from_le_bytes(b.get(at..at + 4).ok_or("truncated ELF header")?.try_into().unwrap()))
}

fn u64_at(b: &[u8], at: usize) -> Result<u64, String> {
    Ok(u64::from_le_bytes(b.get(at..at + 8).ok_or("truncated ELF header")?.try_into().unwrap()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The control: a dynamically linked program of the host is seen as such.
    #[test]
    fn the_hosts_shell_needs_a_loader_and_libc() {
        let sh = std::fs::read("/bin/sh").expect("/bin/sh");
        let found = linkage(&sh).unwrap();
        assert!(found.interpreter.as_deref().is_some_and(|i| i.contains("ld-linux")), "{found:?}");
        assert!(found.needed.iter().any(|l| l.starts_with("libc.so")), "{found:?}");
    }

    #[test]
    fn not_elf_is_an_error() {
        assert!(linkage(b"#!/bin/sh\n").is_err());
    }
}
