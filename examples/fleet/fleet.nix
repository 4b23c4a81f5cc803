# The whole fleet, declared once and imported by every host: two Macs serve
# one worker each, a NixOS gateway runs the proxy in front of both. Each host
# starts only the parts placed on it (`deployOn`), matched against its own
# `networking.hostName` (or `services.mtpstack.hostName`), and every host's
# evaluation checks the coupling of the whole fleet.
let
  hosts = import ./hosts.nix;
in
{
  services.mtpstack = {
    enable = true;
    openFirewall = true;

    # gateway, mac1, mac2 and their addresses, from ./hosts.nix.
    hosts = builtins.mapAttrs (_: h: { inherit (h) address; }) hosts;

    proxy = {
      deployOn = "gateway";
      host = "0.0.0.0";
      port = 8080;
      # The gate for this model, per worker: equals each worker's maxNumSeqs.
      modelConcurrencyLimits."qwen3.8-27b" = 2;
    };

    workers =
      let
        qwen = {
          model = "qwen3.8-27b";
          target = {
            path = "mlx-community/Qwen3.8-27B-4bit";
            bits = 4;
          };
          drafter = {
            path = "lukaskremla/Qwen3.8-27B-MTP-6bit-MLX";
            bits = 6;
            depth = "auto";
          };
          maxNumSeqs = 2;
          port = 8101;
        };
        # Reached from the gateway, so not on loopback; on its own Mac's
        # fleet address rather than 0.0.0.0, since nix-darwin has no port
        # firewall to keep the rest of the network out (docs/nix.md, Firewall).
        on = host: {
          deployOn = host;
          host = hosts.${host}.address;
        };
      in
      {
        qwen-a = qwen // on "mac1";
        qwen-b = qwen // on "mac2";
      };
  };
}
