# expect: distributed-ibv-devices
# One model across two Macs over JACCL (RDMA over Thunderbolt 5), without
# the RDMA devices that connect them: JACCL reads them from the file
# MLX_IBV_DEVICES names, and takes the group's size from it.
let
  parts = import ../parts.nix;
in
{
  services.mtpstack = parts.acrossTwoMacs "10.0.0.12" {
    backend = "jaccl";
    # What it needs: ibvDevices = [ [ null "rdma_en2" ] [ "rdma_en2" null ] ];
  };
}
