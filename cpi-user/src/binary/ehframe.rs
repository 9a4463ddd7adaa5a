//! Function bounds from `.eh_frame` FDEs, for stripped binaries (Debian's keep
//! `.eh_frame`). Each FDE covers one function (or one `.cold` part) with its start and
//! length, which is all we need; CFA programs are not read. A small parser of the
//! pointer encodings gcc/clang emit is enough here, so no DWARF crate is pulled in.

/// `DW_EH_PE_*` pointer encodings (LSB "Exception Frame Header" / DWARF).
const PE_OMIT: u8 = 0xff;
const PE_FORMAT_MASK: u8 = 0x0f;
const PE_APPL_MASK: u8 = 0x70;
const PE_ABSPTR: u8 = 0x00;
const PE_ULEB128: u8 = 0x01;
const PE_UDATA2: u8 = 0x02;
const PE_UDATA4: u8 = 0x03;
const PE_UDATA8: u8 = 0x04;
const PE_SLEB128: u8 = 0x09;
const PE_SDATA2: u8 = 0x0a;
const PE_SDATA4: u8 = 0x0b;
const PE_SDATA8: u8 = 0x0c;
const PE_PCREL: u8 = 0x10;
const PE_DATAREL: u8 = 0x30;

/// Why `.eh_frame` could not be read (the whole section is then ignored).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(".eh_frame at offset {offset:#x}: {what}")]
pub struct EhFrameError {
    /// Byte offset in the section.
    pub offset: usize,
    /// What is wrong.
    pub what: &'static str,
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, what: &'static str) -> EhFrameError {
        EhFrameError {
            offset: self.pos,
            what,
        }
    }

    fn bytes(&mut self, n: usize) -> Result<&'a [u8], EhFrameError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| self.err("truncated"))?;
        let b = &self.data[self.pos..end];
        self.pos = end;
        Ok(b)
    }

    fn u8(&mut self) -> Result<u8, EhFrameError> {
        Ok(self.bytes(1)?[0])
    }

    fn uint(&mut self, n: usize) -> Result<u64, EhFrameError> {
        let b = self.bytes(n)?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(b);
        Ok(u64::from_le_bytes(v))
    }

    fn sint(&mut self, n: usize) -> Result<i64, EhFrameError> {
        let v = self.uint(n)?;
        let shift = 64 - 8 * n as u32;
        Ok(((v << shift) as i64) >> shift)
    }

    fn uleb(&mut self) -> Result<u64, EhFrameError> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= u64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
    }

    fn sleb(&mut self) -> Result<i64, EhFrameError> {
        let (mut v, mut shift) = (0i64, 0u32);
        loop {
            let b = self.u8()?;
            if shift < 64 {
                v |= i64::from(b & 0x7f) << shift;
            }
            shift += 7;
            if b & 0x80 == 0 {
                if shift < 64 && b & 0x40 != 0 {
                    v |= -1i64 << shift;
                }
                return Ok(v);
            }
        }
    }

    fn cstr(&mut self) -> Result<&'a [u8], EhFrameError> {
        let rest = &self.data[self.pos.min(self.data.len())..];
        let n = rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.err("unterminated string"))?;
        let s = &rest[..n];
        self.pos += n + 1;
        Ok(s)
    }

    /// Reads a value in `format` (low 4 bits of an encoding), no application.
    fn raw(&mut self, format: u8) -> Result<u64, EhFrameError> {
        Ok(match format {
            PE_ABSPTR | PE_UDATA8 => self.uint(8)?,
            PE_ULEB128 => self.uleb()?,
            PE_UDATA2 => self.uint(2)?,
            PE_UDATA4 => self.uint(4)?,
            PE_SLEB128 => self.sleb()? as u64,
            PE_SDATA2 => self.sint(2)? as u64,
            PE_SDATA4 => self.sint(4)? as u64,
            PE_SDATA8 => self.sint(8)? as u64,
            _ => return Err(self.err("unsupported pointer format")),
        })
    }

    /// Reads an encoded pointer; `section_addr` is the section's virtual address
    /// (pc-relative pointers are relative to the field's own address).
    fn pointer(&mut self, enc: u8, section_addr: u64, data_base: u64) -> Result<u64, EhFrameError> {
        let field = section_addr.wrapping_add(self.pos as u64);
        let v = self.raw(enc & PE_FORMAT_MASK)?;
        Ok(match enc & PE_APPL_MASK {
            0 => v,
            PE_PCREL => field.wrapping_add(v),
            PE_DATAREL => data_base.wrapping_add(v),
            _ => return Err(self.err("unsupported pointer application")),
        })
    }
}

/// Walks `.eh_frame` (contents `data` at virtual address `addr`) and returns every FDE's
/// `(start, length)` in file order. Zero-length FDEs are skipped.
pub fn fde_ranges(data: &[u8], addr: u64) -> Result<Vec<(u64, u64)>, EhFrameError> {
    // CIE offset → its FDE pointer encoding.
    let mut cie_enc: std::collections::HashMap<usize, u8> = Default::default();
    let mut out = Vec::new();
    let mut r = Reader { data, pos: 0 };
    while r.pos + 4 <= data.len() {
        let entry_start = r.pos;
        let mut len = r.uint(4)?;
        if len == 0 {
            // Terminator (crtend's zero entry); some linkers put more after it.
            continue;
        }
        if len == 0xffff_ffff {
            len = r.uint(8)?;
        }
        let body = r.pos;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| body.checked_add(l))
            .filter(|&e| e <= data.len())
            .ok_or_else(|| r.err("entry runs past the section"))?;
        let id = r.uint(4)?;
        if id == 0 {
            cie_enc.insert(entry_start, parse_cie(&mut r)?);
        } else {
            // The CIE pointer is relative to the id field itself.
            let cie = body
                .checked_sub(id as usize)
                .ok_or_else(|| r.err("CIE pointer before the section"))?;
            let enc = match cie_enc.get(&cie) {
                Some(&e) => e,
                None => {
                    let mut c = Reader { data, pos: cie };
                    c.uint(4)?;
                    if c.uint(4)? != 0 {
                        return Err(r.err("FDE points at a non-CIE"));
                    }
                    let e = parse_cie(&mut c)?;
                    cie_enc.insert(cie, e);
                    e
                }
            };
            let start = r.pointer(enc, addr, 0)?;
            let length = r.raw(enc & PE_FORMAT_MASK)?;
            if length > 0 {
                out.push((start, length));
            }
        }
        r.pos = end;
    }
    Ok(out)
}

/// Parses a CIE after its id field; returns the FDE pointer encoding (`R`).
fn parse_cie(r: &mut Reader<'_>) -> Result<u8, EhFrameError> {
    let version = r.u8()?;
    let aug = r.cstr()?;
    if aug.starts_with(b"eh") {
        return Err(r.err("obsolete 'eh' augmentation"));
    }
    r.uleb()?; // code alignment
    r.sleb()?; // data alignment
    if version == 1 {
        r.u8()?;
    } else {
        r.uleb()?; // return address register
    }
    let mut enc = PE_ABSPTR;
    if aug.first() == Some(&b'z') {
        r.uleb()?; // augmentation data length
        for &c in &aug[1..] {
            match c {
                b'R' => enc = r.u8()?,
                b'L' => {
                    r.u8()?;
                }
                b'P' => {
                    let penc = r.u8()?;
                    if penc != PE_OMIT {
                        r.pointer(penc & !0x80, 0, 0)?;
                    }
                }
                b'S' | b'B' | b'G' => {}
                _ => return Err(r.err("unknown CIE augmentation")),
            }
        }
    }
    Ok(enc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leb128_and_signed_reads() {
        let data = [0xe5, 0x8e, 0x26, 0x7f, 0xfe, 0xff];
        let mut r = Reader {
            data: &data,
            pos: 0,
        };
        assert_eq!(r.uleb().unwrap(), 624485);
        assert_eq!(r.sleb().unwrap(), -1);
        assert_eq!(r.sint(2).unwrap(), -2);
        assert!(r.u8().is_err(), "reading past the end is an error");
    }

    #[test]
    fn parses_a_hand_built_cie_and_fde() {
        // CIE: version 1, "zR", code align 1, data align -8, ra 16, aug len 1, R=pcrel|sdata4.
        let mut d = vec![];
        let cie_body = [1u8, b'z', b'R', 0, 1, 0x78, 16, 1, 0x1b, 0, 0, 0];
        d.extend_from_slice(&((4 + cie_body.len()) as u32).to_le_bytes());
        d.extend_from_slice(&0u32.to_le_bytes());
        d.extend_from_slice(&cie_body);
        let fde_at = d.len();
        // FDE: length, CIE pointer, pc_begin (pcrel), pc_range, aug len 0.
        d.extend_from_slice(&16u32.to_le_bytes());
        d.extend_from_slice(&((fde_at + 4) as u32).to_le_bytes());
        let field = 0x1000 + d.len() as u64;
        d.extend_from_slice(&((0x2000i64 - field as i64) as i32).to_le_bytes());
        d.extend_from_slice(&0x40u32.to_le_bytes());
        d.extend_from_slice(&[0, 0, 0, 0]);
        d.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(fde_ranges(&d, 0x1000).unwrap(), vec![(0x2000, 0x40)]);
        // Truncated input is an error, not a panic.
        assert!(fde_ranges(&d[..fde_at + 10], 0x1000).is_err());
    }
}
