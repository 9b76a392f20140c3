//! Appending the stream's fields to a buffer, big-endian as QEMU writes them; the
//! writer and the example stream both build with it.

use crate::kind;

pub(crate) trait Put {
    fn u8(&mut self, v: u8) -> &mut Self;
    fn be16(&mut self, v: u16) -> &mut Self;
    fn be32(&mut self, v: u32) -> &mut Self;
    fn be64(&mut self, v: u64) -> &mut Self;
    fn bytes(&mut self, b: &[u8]) -> &mut Self;
    /// A counted string: one length byte, then the bytes. Names here come from a
    /// parsed stream or from this crate, so they fit the byte.
    fn cstr(&mut self, s: &str) -> &mut Self;
    /// Section `id`'s footer.
    fn footer(&mut self, id: u32) -> &mut Self;
}

impl Put for Vec<u8> {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.push(v);
        self
    }
    fn be16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }
    fn be32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }
    fn be64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_be_bytes())
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.extend_from_slice(b);
        self
    }
    fn cstr(&mut self, s: &str) -> &mut Self {
        let b = s.as_bytes();
        assert!(b.len() <= 255, "a name of {} bytes", b.len());
        self.u8(b.len() as u8).bytes(b)
    }
    fn footer(&mut self, id: u32) -> &mut Self {
        self.u8(kind::FOOTER).be32(id)
    }
}
