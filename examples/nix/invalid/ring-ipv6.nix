# expect: distributed-needs-ip
# One model across two hosts over MLX's ring, one of them given by its IPv6
# address: the ring splits `address:port` at the first colon and opens IPv4
# sockets, so `fd00::12:18101` can never be dialled.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = parts.acrossTwoMacs "fd00::12" { };
}
