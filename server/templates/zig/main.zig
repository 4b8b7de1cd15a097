//! {{name}}: a Tern request handler in Zig, written against Tern's ABI v1 (ABI.md).
const std = @import("std");

extern "tern" fn response_set_status(status: i32) i32;
extern "tern" fn response_header_append(name: [*]const u8, name_len: usize, value: [*]const u8, value_len: usize) i32;
extern "tern" fn response_body_write(buf: [*]const u8, len: usize) i32;
extern "tern" fn request_uri(buf: [*]u8, len: usize) i32;

fn write(s: []const u8) void {
    _ = response_body_write(s.ptr, s.len);
}

pub fn main() void {
    var path: [1024]u8 = undefined;
    const n = request_uri(&path, path.len);
    const len: usize = if (n < 0) 0 else @min(@as(usize, @intCast(n)), path.len);
    const name = "content-type";
    const value = "text/plain; charset=utf-8";
    _ = response_set_status(200);
    _ = response_header_append(name.ptr, name.len, value.ptr, value.len);
    write("Hello from {{name}}! You asked for ");
    write(path[0..len]);
    write("\n");
}
