//! Shifting the line numbers of a compiled Lua 5.5 chunk.
//!
//! A region is compiled from its own source (so the lexer never counts the file lines above
//! it) and its dump is then rewritten so every line it records is the prompt-file line: the
//! line each nested function was defined on (`linedefined`, `lastlinedefined`), every absolute
//! line-info entry, and the main function's base. The main function must keep `linedefined`
//! 0 (that is how Lua knows a main chunk), so its base moves through an absolute line-info
//! entry placed at its first instruction instead, which is the form Lua itself uses for a
//! line too far from the previous one.
//!
//! Written by hand because no crate reads or writes Lua 5.5's dump format (`ldump.c` /
//! `lundump.c`, whose layout this follows field for field). Any byte the rewriter does not
//! expect makes it give up (`None`), and the caller falls back to padding the source.

/// `ABSLINEINFO` of `ldebug.h`: a line-info byte meaning "see the absolute entries".
const ABSLINEINFO: u8 = 0x80;
const LUA_VNIL: u8 = 0x00;
const LUA_VFALSE: u8 = 0x01;
const LUA_VTRUE: u8 = 0x11;
const LUA_VNUMINT: u8 = 0x03;
const LUA_VNUMFLT: u8 = 0x13;
const LUA_VSHRSTR: u8 = 0x04;
const LUA_VLNGSTR: u8 = 0x14;
/// `LUA_SIGNATURE` and the bytes after it up to the size checks: version, format, `LUAC_DATA`.
const HEADER_FIXED: usize = 4 + 1 + 1 + 6;

struct Rewriter<'a> {
    input: &'a [u8],
    at: usize,
    out: Vec<u8>,
    int_size: usize,
    number_size: usize,
    offset: i64,
}

impl Rewriter<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        let end = self.at.checked_add(n)?;
        let bytes = self.input.get(self.at..end)?;
        self.at = end;
        Some(bytes)
    }

    fn copy(&mut self, n: usize) -> Option<()> {
        let end = self.at.checked_add(n)?;
        let bytes = self.input.get(self.at..end)?;
        self.out.extend_from_slice(bytes);
        self.at = end;
        Some(())
    }

    fn byte(&mut self) -> Option<u8> {
        let b = *self.input.get(self.at)?;
        self.at += 1;
        Some(b)
    }

    fn copy_byte(&mut self) -> Option<u8> {
        let b = self.byte()?;
        self.out.push(b);
        Some(b)
    }

    /// An MSB-first varint (`dumpVarint`).
    fn varint(&mut self) -> Option<u64> {
        let mut value: u64 = 0;
        for _ in 0..10 {
            let b = self.byte()?;
            value = value.checked_mul(128)? | u64::from(b & 0x7f);
            if b & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn write_varint(&mut self, mut value: u64) {
        let mut buf = [0u8; 10];
        let mut n = 1;
        buf[9] = (value & 0x7f) as u8;
        value >>= 7;
        while value != 0 {
            n += 1;
            buf[10 - n] = ((value & 0x7f) as u8) | 0x80;
            value >>= 7;
        }
        self.out.extend_from_slice(&buf[10 - n..]);
    }

    fn copy_varint(&mut self) -> Option<u64> {
        let v = self.varint()?;
        self.write_varint(v);
        Some(v)
    }

    /// Skip the input's padding to `align` and write the output's own (both are counted from
    /// the start of their dump, as `dumpAlign` / `loadAlign` do).
    fn align(&mut self, align: usize) -> Option<()> {
        let pad_in = (align - self.at % align) % align;
        self.take(pad_in)?;
        let pad_out = (align - self.out.len() % align) % align;
        self.out.extend(std::iter::repeat_n(0u8, pad_out));
        Some(())
    }

    fn string(&mut self) -> Option<()> {
        let size = self.copy_varint()?;
        if size == 0 {
            self.copy_varint()?;
        } else {
            self.copy(usize::try_from(size).ok()?)?;
        }
        Some(())
    }

    fn shifted(&self, line: u64) -> Option<u64> {
        u64::try_from(i64::try_from(line).ok()?.checked_add(self.offset)?).ok()
    }

    fn function(&mut self, main: bool) -> Option<()> {
        for _ in 0..2 {
            let line = self.varint()?;
            let line = if main { line } else { self.shifted(line)? };
            self.write_varint(line);
        }
        self.copy(3)?; // numparams, flag, maxstacksize
        let code = usize::try_from(self.copy_varint()?).ok()?;
        self.align(4)?;
        self.copy(code.checked_mul(4)?)?;
        let constants = self.copy_varint()?;
        for _ in 0..constants {
            match self.copy_byte()? {
                LUA_VNIL | LUA_VFALSE | LUA_VTRUE => {}
                LUA_VNUMINT => {
                    self.copy_varint()?;
                }
                LUA_VNUMFLT => self.copy(self.number_size)?,
                LUA_VSHRSTR | LUA_VLNGSTR => self.string()?,
                _ => return None,
            }
        }
        let upvalues = usize::try_from(self.copy_varint()?).ok()?;
        self.copy(upvalues.checked_mul(3)?)?;
        let protos = self.copy_varint()?;
        for _ in 0..protos {
            self.function(false)?;
        }
        self.string()?; // source
        // Line information.
        let size = usize::try_from(self.varint()?).ok()?;
        let mut lineinfo = self.take(size)?.to_vec();
        let count = usize::try_from(self.varint()?).ok()?;
        let mut absolute: Vec<(i64, i64)> = Vec::with_capacity(count + 1);
        if count > 0 {
            let pad_in = (4 - self.at % 4) % 4;
            self.take(pad_in)?;
            for _ in 0..count {
                let pc = self.int()?;
                let line = self.int()?;
                absolute.push((pc, line.checked_add(self.offset)?));
            }
        }
        if main && !lineinfo.is_empty() {
            if lineinfo[0] == ABSLINEINFO {
                // Already absolute at the first instruction: shifted above.
            } else {
                // The main function's lines count from its `linedefined`, 0: move the base
                // with an absolute entry at instruction 0.
                let first = i64::from(lineinfo[0] as i8);
                lineinfo[0] = ABSLINEINFO;
                absolute.insert(0, (0, first.checked_add(self.offset)?));
            }
        }
        self.write_varint(lineinfo.len() as u64);
        self.out.extend_from_slice(&lineinfo);
        self.write_varint(absolute.len() as u64);
        if !absolute.is_empty() {
            let pad_out = (4 - self.out.len() % 4) % 4;
            self.out.extend(std::iter::repeat_n(0u8, pad_out));
            for (pc, line) in absolute {
                self.write_int(pc)?;
                self.write_int(line)?;
            }
        }
        let locals = self.copy_varint()?;
        for _ in 0..locals {
            self.string()?;
            self.copy_varint()?;
            self.copy_varint()?;
        }
        let names = self.copy_varint()?;
        for _ in 0..names {
            self.string()?;
        }
        Some(())
    }

    /// A native `int` of the dump (absolute line info).
    fn int(&mut self) -> Option<i64> {
        let bytes = self.take(self.int_size)?;
        match bytes.len() {
            4 => Some(i64::from(i32::from_ne_bytes(bytes.try_into().ok()?))),
            8 => Some(i64::from_ne_bytes(bytes.try_into().ok()?)),
            _ => None,
        }
    }

    fn write_int(&mut self, value: i64) -> Option<()> {
        match self.int_size {
            4 => self
                .out
                .extend_from_slice(&i32::try_from(value).ok()?.to_ne_bytes()),
            8 => self.out.extend_from_slice(&value.to_ne_bytes()),
            _ => return None,
        }
        Some(())
    }
}

/// The dump `chunk` with every recorded line moved down by `offset` lines, or `None` when the
/// dump is not in the form this rewriter knows.
pub(crate) fn shift_lines(chunk: &[u8], offset: u32) -> Option<Vec<u8>> {
    let mut w = Rewriter {
        input: chunk,
        at: 0,
        out: Vec::with_capacity(chunk.len() + 16),
        int_size: 0,
        number_size: 0,
        offset: i64::from(offset),
    };
    w.copy(HEADER_FIXED)?;
    // Four size checks, each a size byte and a sample value: int, Instruction, lua_Integer,
    // lua_Number.
    let mut sizes = [0usize; 4];
    for size in &mut sizes {
        *size = usize::from(w.copy_byte()?);
        w.copy(*size)?;
    }
    if sizes[1] != 4 {
        return None;
    }
    w.int_size = sizes[0];
    w.number_size = sizes[3];
    w.copy_byte()?; // the main function's upvalue count
    w.function(true)?;
    (w.at == chunk.len()).then_some(w.out)
}
