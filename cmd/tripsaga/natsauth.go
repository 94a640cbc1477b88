package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tripsaga/tripsaga/events"
	"github.com/tripsaga/tripsaga/natsauth"
)

// natsAuthCmd is `tripsaga nats-auth`: the NATS identities' seed files and
// public keys for a NATS server run outside tripsaga (compose's).
func natsAuthCmd() *cobra.Command {
	var dir, conf string
	cmd := &cobra.Command{
		Use:   "nats-auth",
		Short: "Write a NATS user nkey seed per identity (NATS_CREDS of each process) and their public keys for a NATS server's configuration",
		Long: `nats-auth makes, in --dir, one user nkey seed file per NATS identity of
the catalogue (natsauth: every service and admin; with STEPS, the
catalogue it orders), <identity>.nk with mode 0600, keeping a valid one
already there, and writes their public keys to --dir/nkeys.conf, which the
server configuration (deploy/nats/nats-server.conf, or --conf) includes as
auth/nkeys.conf. Each process is given its own file as NATS_CREDS. compose
runs it once before the NATS server starts. To rotate an identity's key,
delete its file, run this again and restart the server and that process
(SECURITY.md). It prints the files it wrote, never a seed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := events.FromEnv()
			if err != nil {
				return err
			}
			ids := natsauth.Identities(c)
			if _, err := natsauth.Provision(dir, ids); err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, id := range ids {
				fmt.Fprintln(w, natsauth.CredsFile(dir, id.Name))
			}
			fmt.Fprintln(w, filepath.Join(dir, natsauth.NkeysConf))
			if conf != "" {
				if err := os.WriteFile(conf, natsauth.ServerConf(c), 0o644); err != nil {
					return err
				}
				fmt.Fprintln(w, conf)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "`folder` of the seed files and nkeys.conf (required)")
	cmd.Flags().StringVar(&conf, "conf", "", "also write the server configuration for this catalogue to this `file` (it includes auth/nkeys.conf next to it)")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}
